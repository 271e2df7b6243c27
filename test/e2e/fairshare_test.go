package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// done is one request a fair-share client finished.
type done struct {
	tenant, id string
	status     int
	end        time.Time
}

// closedLoopTenant runs clients closed-loop streaming clients of tenant (its key
// is "sk-" and its name) against d for dur, each stream 10 tokens, and
// returns what they finished.
func closedLoopTenant(ctx context.Context, d *daemon, tenant string, clients int, dur time.Duration) []done {
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer hc.CloseIdleConnections()
	var mu sync.Mutex
	var out []done
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("m", true, 10)))
				req.Header.Set("Authorization", "Bearer sk-"+tenant)
				resp, err := hc.Do(req)
				if err != nil {
					continue // the phase ended (or a transport error, which the access log would not have)
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil {
					continue // cut by the phase's end
				}
				mu.Lock()
				out = append(out, done{tenant, resp.Header.Get("X-Request-Id"), resp.StatusCode, time.Now()})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// queueWaits reads, from d's access log (stdout), the queue wait of each
// request of ds, waiting (bounded) for the lines that are still queued.
func queueWaits(t *testing.T, d *daemon, ds []done) []time.Duration {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		waits := make(map[string]time.Duration)
		for line := range strings.Lines(d.stdout.String()) {
			var l struct {
				ID   string  `json:"request_id"`
				Wait float64 `json:"queue_wait_ms"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.ID != "" {
				waits[l.ID] = time.Duration(l.Wait * float64(time.Millisecond))
			}
		}
		var out []time.Duration
		for _, r := range ds {
			if w, ok := waits[r.id]; ok {
				out = append(out, w)
			}
		}
		if len(out) == len(ds) {
			slices.Sort(out)
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests have an access-log line", len(out), len(ds))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// p95 of sorted durations.
func p95(sorted []time.Duration) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[(len(sorted)*95+99)/100-1]
}

// ofTenant keeps the requests of tenant that ended OK within [from, to).
func ofTenant(ds []done, tenant string, from, to time.Time) []done {
	var out []done
	for _, r := range ds {
		if r.tenant == tenant && r.status == http.StatusOK && !r.end.Before(from) && r.end.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// together runs closedLoopTenant for each tenant at once, clients[i] for
// tenants[i], and returns what they all finished and when they started.
func together(ctx context.Context, d *daemon, dur time.Duration, tenants []string, clients []int) ([]done, time.Time) {
	start := time.Now()
	var mu sync.Mutex
	var all []done
	var wg sync.WaitGroup
	for i, ten := range tenants {
		wg.Go(func() {
			ds := closedLoopTenant(ctx, d, ten, clients[i], dur)
			mu.Lock()
			all = append(all, ds...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, start
}

// The noisy neighbour, on one engine with maxInFlight 4, streams of 10
// tokens 5 ms apart:
//   - team-a (reserved, weight 10) with 32 closed-loop streams and team-b
//     (shared, 1) with 4: while both are backlogged, the slots go 10:1,
//     within ±10% of each tenant's share;
//   - the reverse, a shared tenant flooding with 32 streams beside a
//     reserved one with 4: the reserved tenant's p95 queue wait stays within
//     2× its solo p95 plus 100 ms;
//   - a background tenant with a backlog beside team-a's flood waits its
//     ageing bound (5 s) and no more than a moment beyond it.
func TestNoisyNeighbour(t *testing.T) {
	tag := t.Name()
	raiseFileLimit(t, 1024)
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "5ms"}, Extra: map[string]any{"maxInFlight": 4}}}, nil),
		"--log-level", "info", "--tenants", writeTenants(t, tenantsJSON(
			tenantSpec{Name: "team-a", Key: "sk-team-a", Tier: "reserved"},
			tenantSpec{Name: "team-b", Key: "sk-team-b"},
			tenantSpec{Name: "team-c", Key: "sk-team-c", Tier: "reserved"},
			tenantSpec{Name: "nightly", Key: "sk-nightly", Tier: "batch"},
		)))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx := t.Context()
	const phase = 6 * time.Second

	// team-b alone, then beside team-a's flood.
	soloB := closedLoopTenant(ctx, d, "team-b", 4, 3*time.Second)
	soloBP95 := p95(queueWaits(t, d, soloB))
	all, start := together(ctx, d, phase, []string{"team-a", "team-b"}, []int{32, 4})
	// Both are backlogged from the first second to the last but one.
	from, to := start.Add(time.Second), start.Add(phase-time.Second)
	a, b := ofTenant(all, "team-a", from, to), ofTenant(all, "team-b", from, to)
	total := float64(len(a) + len(b))
	shareA, shareB := float64(len(a))/total, float64(len(b))/total
	bWaits := queueWaits(t, d, b)
	rate := total / (to.Sub(from).Seconds())
	t.Logf("backlogged both: %d requests in %s (%.0f/s): team-a %d (%.1f%%, weight share 90.9%%), team-b %d (%.1f%%, weight share 9.1%%)",
		int(total), to.Sub(from), rate, len(a), 100*shareA, len(b), 100*shareB)
	t.Logf("team-b's p95 queue wait: solo %v, beside team-a %v; the bound 2×solo+100ms would be %v, but a weight of 1 against 10 on 4 slots gives team-b 1 slot in 11",
		soloBP95, p95(bWaits), 2*soloBP95+100*time.Millisecond)
	if total < 100 {
		t.Fatalf("only %d requests while both were backlogged: too few to weigh shares", int(total))
	}
	if shareB < 0.9/11 || shareB > 1.1/11 || shareA < 0.9*10/11 || shareA > 1.1*10/11 {
		t.Errorf("shares team-a %.3f, team-b %.3f; want 10/11 and 1/11 within ±10%%", shareA, shareB)
	}
	// team-b's wait is its share's: its 4 streams take turns at one slot in
	// 11, so a request waits about 4×11 slot releases; at most twice that.
	if bound := 2 * time.Duration(4*11/rate*float64(time.Second)); p95(bWaits) > bound {
		t.Errorf("team-b's p95 wait %v beyond twice its weighted share's %v", p95(bWaits), bound/2)
	}

	// The reverse: team-c, reserved, with 4 streams, alone and beside
	// team-b flooding with 32.
	soloC := closedLoopTenant(ctx, d, "team-c", 4, 3*time.Second)
	soloCP95 := p95(queueWaits(t, d, soloC))
	all, start = together(ctx, d, phase, []string{"team-c", "team-b"}, []int{4, 32})
	from, to = start.Add(time.Second), start.Add(phase-time.Second)
	c := ofTenant(all, "team-c", from, to)
	cP95 := p95(queueWaits(t, d, c))
	t.Logf("team-c (reserved, 4 streams) beside team-b (shared, 32): %d requests, p95 queue wait %v; solo %v; bound %v",
		len(c), cP95, soloCP95, 2*soloCP95+100*time.Millisecond)
	if len(c) == 0 || cP95 > 2*soloCP95+100*time.Millisecond {
		t.Errorf("team-c's p95 queue wait %v beside a flood, solo %v: beyond 2×solo+100ms", cP95, soloCP95)
	}

	// A background tenant beside team-a's flood: each of its requests waits
	// for the ageing bound, then goes in at the next free slot. The flood
	// starts first and outlasts the background tenant's phase, so that no
	// background request finds a free slot before or after it.
	flood := make(chan []done, 1)
	go func() { flood <- closedLoopTenant(ctx, d, "team-a", 32, 16*time.Second) }()
	d.waitPool("p0", 10*time.Second, "team-a backlogged", func(p poolView) bool { return p.Waiting["m"] >= 8 })
	n := ofTenant(closedLoopTenant(ctx, d, "nightly", 2, 12*time.Second), "nightly", time.Time{}, time.Now().Add(time.Hour))
	<-flood
	nWaits := queueWaits(t, d, n)
	t.Logf("nightly (background) beside team-a's flood: %d requests, queue waits %v", len(n), nWaits)
	if len(n) == 0 {
		t.Fatal("the background tenant was starved")
	}
	for _, w := range nWaits {
		if w < 4*time.Second || w > 8*time.Second {
			t.Errorf("a background request waited %v; want its ageing bound, 5 s, and at most a moment more", w)
		}
	}
}
