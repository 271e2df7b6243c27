package main

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/proxy"
	"github.com/poold/poold/internal/statusapi"
)

// BenchmarkProxy runs poold's handler in this process (pool set, proxy,
// metrics, access log as JSON into io.Discard), with the simulator as its
// engine process, so that go test -cpuprofile/-memprofile profile poold's hot
// path; the load generator is in the profile too. Per op: one request.
//
//	go test -run '^$' -bench Proxy -benchmem -cpuprofile cpu.out -memprofile mem.out ./test/bench/
func BenchmarkProxy(b *testing.B) {
	dir := b.TempDir()
	bin := filepath.Join(dir, "poold")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/poold/poold/cmd/poold").CombinedOutput(); err != nil {
		b.Fatalf("building poold: %v\n%s", err, out)
	}
	cfg, err := profile.Parse(profiles(map[string][]string{mFast: nil}, false))
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pools := pool.NewSet(cfg, pool.Options{Launch: profile.Launch{Self: bin}})
	var h *proxy.Handler
	m := metrics.New(reg, func() []statusapi.Pool { return h.PoolStatus() }, "bench", "")
	h = proxy.New(cfg, pools, proxy.Options{Metrics: m, AccessLog: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	pools.Run(ctx)
	defer func() {
		cancel()
		pools.Wait()
	}()
	srv := httptest.NewServer(h)
	defer srv.Close()
	deadline := time.Now().Add(30 * time.Second)
	for h.PoolStatus()[0].State != pool.StateReady.String() {
		if time.Now().After(deadline) {
			b.Fatal("the engine did not become ready")
		}
		time.Sleep(5 * time.Millisecond) // polling the pool's state, bounded above
	}
	c := newClient(64)
	for _, tc := range []struct {
		name string
		sh   shape
	}{{"plain", chat(mFast, 16, false)}, {"stream64", chat(mFast, 64, true)}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if s := do(ctx, c, srv.URL, tc.sh); s.err != nil {
						b.Error(s.err)
						return
					}
				}
			})
		})
	}
}
