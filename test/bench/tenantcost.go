package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
)

// tenantsFile is a tenants file of n tenants, each with limits far above
// what a run sends and an output cap, so that every request goes through
// each step of the gate; key is tenant n/2's API key.
func tenantsFile(n int) (data []byte, key string, err error) {
	type tenant struct {
		Name            string   `json:"name"`
		Keys            []string `json:"keys"`
		Tier            string   `json:"tier"`
		RPM             int      `json:"rpm"`
		TPM             int      `json:"tpm"`
		MaxOutputTokens int      `json:"maxOutputTokens"`
	}
	ts := make([]tenant, n)
	for i := range ts {
		sum := sha256.Sum256(fmt.Appendf(nil, "sk-bench-%d", i))
		ts[i] = tenant{fmt.Sprintf("tenant-%d", i), []string{"sha256:" + hex.EncodeToString(sum[:])}, "shared", 1 << 30, 1 << 40, 1 << 20}
	}
	data, err = json.Marshal(map[string]any{"tiers": map[string]any{"shared": map[string]int{"weight": 1}}, "tenants": ts})
	return data, fmt.Sprintf("sk-bench-%d", n/2), err
}

// keyed presents an API key on every request.
type keyed struct {
	key  string
	next http.RoundTripper
}

func (k keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return k.next.RoundTrip(r)
}

// w1t: what a tenants file of 10,000 tenants adds to a plain request
// (target: at most 5 µs). Measured twice: the gate alone in process (go
// test -bench BenchmarkGate in internal/tenant, no file against 10,000
// tenants: the figure the target applies to), and workload 1 (concurrency
// 1) through two fresh poolds, one with the file and one without, in
// alternating rounds: a p50 difference of a few µs is within the noise of
// two processes' latencies, so that row is shown, not judged.
func (b *bench) w1t(ctx context.Context) error {
	stats, err := goBench(ctx, b, "github.com/poold/poold/internal/tenant", "^BenchmarkGate$")
	if err != nil {
		return err
	}
	none, many := stats["BenchmarkGate/tenants=none"], stats["BenchmarkGate/tenants=10000"]
	if none.ns == 0 || many.ns == 0 {
		return fmt.Errorf("BenchmarkGate: results missing from go test output")
	}
	add := (many.ns - none.ns) / 1e9
	b.rep.add("1t", "tenant gate per request (go test -bench), no file → 10,000 tenants",
		fmt.Sprintf("%.0f ns", none.ns), fmt.Sprintf("%.0f ns", many.ns), plus(add, us), "added ≤ 5 µs", ptr(add <= 5e-6))

	data, key, err := tenantsFile(10000)
	if err != nil {
		return err
	}
	file, err := writeConfig(b.dir, "tenants-10000.json", data)
	if err != nil {
		return err
	}
	on, off, stop, err := b.startPair(ctx, "1t", []string{"--tenants", file}, nil)
	defer stop()
	if err != nil {
		return err
	}
	withKey := &http.Client{Transport: keyed{key, b.pc.Transport}}
	sh := chat(mFast, 16, false)
	rs, err := b.rotate(ctx, []side{{"10,000 tenants", on.base, withKey}, {"no tenants file", off.base, b.pc}}, func(s side) (result, error) {
		return closedLoop(ctx, s.client, s.base, sh, 1, b.o.dur, 0), nil
	})
	if err != nil {
		return err
	}
	b.checkUsage(rs[1], rs[0], "1t")
	a50 := pairMed(rs[1], rs[0], q(.5), added)
	b.rep.add("1t", "p50 latency through poold, no file → 10,000 tenants", us(med(rs[1], q(.5))), us(med(rs[0], q(.5))), plus(a50, us), "", nil)
	return nil
}
