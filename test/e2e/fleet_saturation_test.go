package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// flood keeps n requests for model a in flight against d directly (about
// half a second of generation each), until the returned stop is called.
func flood(t *testing.T, d *daemon, n int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				code, _, body, err := d.post(ctx, "/v1/chat/completions", chatBody("a", false, 25))
				if ctx.Err() != nil {
					return
				}
				if err != nil || code != http.StatusOK {
					t.Errorf("flood of %s: %d %s %v", d.url, code, body, err)
					return
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

// poolLoad is the requests for a in flight on host's pool and waiting in
// its poold's queue, as fleetd last saw them.
func (f *fleetd) poolLoad(host string) (inFlight, waiting int) {
	for _, h := range f.status().Hosts {
		if h.Name == host && len(h.Pools) == 1 {
			return h.Pools[0].InFlight, h.Pools[0].Waiting["a"]
		}
	}
	return 0, 0
}

// Two hosts with model a awake and a third with an empty pool; poold admits
// as many requests as the engine's --max-num-seqs and queues the rest. Host
// 1, past 10 waiting, is saturated, and host 2 about as loaded but not:
// fleetd's requests all go to host 2 (by load alone, affinity would spread
// them over both). Both saturated: the third host loads a copy. Once the
// load is gone for the scale-in window, fleetd unloads that copy through
// the host's admin API, and the two first copies stay.
func TestFleetSaturation(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin-token")
	writeFile(t, tokenFile, []byte("fleet-admin\n"))
	var hosts []*daemon
	for i, h := range []struct{ dflt, seqs string }{{"a", "2"}, {"a", "4"}, {"", "2"}} {
		tag := fmt.Sprintf("%s-%d", t.Name(), i+1)
		hosts = append(hosts, startPoold(t, tag, hostProfiles(tag, h.dflt, []string{"a"}, "--max-num-seqs", h.seqs), "--admin-token-file", tokenFile))
	}
	for _, h := range hosts[:2] {
		h.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	}
	const window = 3 * time.Second
	f := startFleetd(t, hosts, "--scale-in-window", window.String(), "--host-admin-token-file", tokenFile)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Host 1: 2 running and 11 waiting, saturated; host 2: 4 running and 8
	// waiting (9 with fleetd's request), not.
	stop1 := flood(t, hosts[0], 13)
	defer stop1()
	stop2 := flood(t, hosts[1], 12)
	defer stop2()
	poll(t, 30*time.Second, "fleetd sees host1 saturated and host2 loaded", func() bool {
		_, w1 := f.poolLoad("host1")
		n2, w2 := f.poolLoad("host2")
		return w1 > 10 && n2+w2 >= 10
	})
	split := map[string]int{}
	for i := range 10 {
		code, host, body, err := f.post(ctx, fmt.Sprintf(`{"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "request %d"}]}`, i))
		if err != nil || code != http.StatusOK {
			t.Fatalf("through fleetd: %d %s %v", code, body, err)
		}
		split[host]++
	}
	n1, w1 := f.poolLoad("host1")
	n2, w2 := f.poolLoad("host2")
	t.Logf("host1 %d running + %d waiting (saturated), host2 %d + %d: fleetd's 10 requests went %v", n1, w1, n2, w2, split)
	if split["host2"] != 10 {
		t.Fatalf("fleetd's requests did not all go to the unsaturated host2: %v", split)
	}

	// Both saturated: host 3 loads a copy.
	stop3 := flood(t, hosts[1], 4) // 4 running and 12 waiting
	defer stop3()
	poll(t, 30*time.Second, "fleetd sees host2 saturated", func() bool { _, w := f.poolLoad("host2"); return w > 10 })
	code, host, body, err := f.post(ctx, `{"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "one more"}]}`)
	if err != nil || code != http.StatusOK || host != "host3" {
		t.Fatalf("with both copies saturated: %d from %q (want host3): %s %v", code, host, body, err)
	}
	poll(t, 10*time.Second, "the scale-out decision in the access log", func() bool {
		return f.logged(map[string]any{"reason": "scale-out", "host": "host3"})
	})
	hosts[2].waitPool("gpu0", 30*time.Second, "a third copy", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })

	// The load ends: after the window, the third copy is unloaded.
	stop1()
	stop2()
	stop3()
	calm := time.Now()
	hosts[2].waitPool("gpu0", 60*time.Second, "the third copy unloaded", func(p poolView) bool { return p.State == "empty" })
	took := time.Since(calm)
	t.Logf("the third copy was unloaded %v after the load ended (window %v)", took.Round(100*time.Millisecond), window)
	if took < window {
		t.Fatalf("the copy was unloaded %v after the load ended, within the %v window", took, window)
	}
	for _, h := range hosts[:2] {
		if p := h.pool("gpu0"); p.State != "ready" || p.Profile != "a" {
			t.Fatalf("a first copy was touched: %+v", p)
		}
	}
	if n := metricSum(t, f.url, "fleetd_scale_events_total", `direction="in"`, `result="unloaded"`); n != 1 {
		t.Fatalf("%v scale-ins counted, want 1", n)
	}
	if n := metricSum(t, f.url, "fleetd_scale_events_total", `direction="out"`, `result="claimed"`); n != 1 {
		t.Fatalf("%v scale-outs counted, want 1", n)
	}
}
