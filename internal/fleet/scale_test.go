package fleet

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poold/poold/internal/placement"
	"github.com/poold/poold/internal/statusapi"
)

func TestPlanScaleIn(t *testing.T) {
	const window = time.Minute
	spec := ModelSpec{MinCopies: 1, window: window}
	calm := t0.Add(-window) // calm for a whole window at t0
	awakeCopy := func(host string, load int) Choice { return Choice{Host: host, Rank: placement.Awake, Load: load} }
	hotCopy := func(host string) Choice { return Choice{Host: host, Rank: placement.Awake, Load: 20, Saturated: true} }
	cases := []struct {
		name      string
		order     []Choice
		extra     map[string]time.Time
		calmSince time.Time
		spec      ModelSpec
		want      scalePlan
	}{
		{"calm for the window: the extra copy goes",
			[]Choice{awakeCopy("a", 1), awakeCopy("x", 0)}, map[string]time.Time{"x": calm}, calm, spec,
			scalePlan{calmSince: t0, unload: "x"}},
		{"calm, but not for the whole window",
			[]Choice{awakeCopy("a", 1), awakeCopy("x", 0)}, map[string]time.Time{"x": calm}, calm.Add(time.Second), spec,
			scalePlan{calmSince: calm.Add(time.Second)}},
		{"the first calm look starts the window",
			[]Choice{awakeCopy("a", 1), awakeCopy("x", 0)}, map[string]time.Time{"x": calm}, time.Time{}, spec,
			scalePlan{calmSince: t0}},
		{"a saturated copy restarts the window",
			[]Choice{awakeCopy("a", 1), hotCopy("x")}, map[string]time.Time{"x": calm}, calm, spec,
			scalePlan{}},
		{"no copy awake: no window",
			[]Choice{{Host: "x", Rank: placement.Loading}}, map[string]time.Time{"x": calm}, calm, spec,
			scalePlan{}},
		{"at minCopies nothing goes",
			[]Choice{awakeCopy("a", 1), awakeCopy("x", 0)}, map[string]time.Time{"x": calm}, calm, ModelSpec{MinCopies: 2, window: window},
			scalePlan{calmSince: calm}},
		{"above minCopies the least loaded extra copy goes, one per window",
			[]Choice{awakeCopy("a", 0), awakeCopy("x", 3), awakeCopy("y", 1), awakeCopy("b", 0)}, map[string]time.Time{"x": calm, "y": calm}, calm, ModelSpec{MinCopies: 2, window: window},
			scalePlan{calmSince: t0, unload: "y"}},
		{"only copies this fleetd loaded go",
			[]Choice{awakeCopy("a", 0), awakeCopy("b", 0)}, map[string]time.Time{"x": t0}, calm, spec,
			scalePlan{calmSince: calm}},
		{"an extra copy still loading stays",
			[]Choice{awakeCopy("a", 0), {Host: "x", Rank: placement.Loading}}, map[string]time.Time{"x": calm.Add(-time.Hour)}, calm, spec,
			scalePlan{calmSince: calm}},
		{"an extra copy not yet seen loading stays for a window",
			[]Choice{awakeCopy("a", 0), {Host: "x", Rank: placement.Empty}}, map[string]time.Time{"x": t0.Add(-time.Second)}, calm, spec,
			scalePlan{calmSince: calm}},
		{"an extra copy gone a window after its load is forgotten",
			[]Choice{awakeCopy("a", 0), {Host: "x", Rank: placement.Idle}}, map[string]time.Time{"x": calm, "y": calm}, calm, spec,
			scalePlan{calmSince: calm, gone: []string{"x", "y"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := planScaleIn(c.order, c.extra, c.calmSince, t0, c.spec)
			if !got.calmSince.Equal(c.want.calmSince) || got.unload != c.want.unload || !slices.Equal(got.gone, c.want.gone) {
				t.Fatalf("planScaleIn = %+v; want %+v", got, c.want)
			}
		})
	}
}

// A copy loaded by scaling out, once every copy has been unsaturated for
// the window, is unloaded through its host's admin API with the admin
// token; the copy that was there first stays.
func TestScaleIn(t *testing.T) {
	first := newFakeHost(t, "first", []statusapi.Pool{saturatedPool("gpu0", "m")}, model("m", "m"))
	spare := newFakeHost(t, "spare", []statusapi.Pool{emptyPool("gpu0")}, model("m", "m"))
	tf := startFleet(t, Options{ScaleInWindow: 200 * time.Millisecond, AdminToken: "admin-secret"},
		HandlerOptions{ScaleOut: true, ScaleOutCooldown: time.Hour}, first, spare)
	tf.waitHost("first", "saturated sample", func(h statusapi.Host) bool { return len(h.Pools) == 1 && h.Pools[0].EngineStats != nil })
	resp, _ := tf.post(`{"model": "m"}`)
	if h := resp.Header.Get("X-Fleet-Host"); h != "spare" {
		t.Fatalf("no scale-out: the request went to %s", h)
	}
	// The new copy is up, and the load is gone.
	calm := readyPool("gpu0", "m", 0)
	calm.EngineStats = &statusapi.EngineStats{SampledAt: time.Now().Add(time.Hour)} // fresh all test long
	first.set(func(fh *fakeHost) { fh.pools = []statusapi.Pool{calm} })
	spare.set(func(fh *fakeHost) { fh.pools = []statusapi.Pool{calm} })
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(tf.fleet.metrics.scaling.WithLabelValues("in", "unloaded")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the extra copy was not unloaded within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	spare.mu.Lock()
	paths, auth := slices.Clone(spare.paths), slices.Clone(spare.auth)
	spare.mu.Unlock()
	if i := slices.Index(paths, "/admin/pools/gpu0/unload"); i < 0 || auth[i] != "Bearer admin-secret" {
		t.Fatalf("spare's POSTs: %v with %v; want an unload with the admin token", paths, auth)
	}
	first.mu.Lock()
	defer first.mu.Unlock()
	if slices.ContainsFunc(first.paths, func(p string) bool { return p != "/v1/chat/completions" }) {
		t.Fatalf("the first copy's host got %v", first.paths)
	}
	if n := testutil.ToFloat64(tf.fleet.metrics.scaling.WithLabelValues("out", "claimed")); n != 1 {
		t.Fatalf("%v scale-outs counted, want 1", n)
	}
}
