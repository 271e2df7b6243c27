package usage

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/activity"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func iv(poolName string, a activity.Activity, profile string, from, to float64, gpus ...int) Interval {
	return Interval{Pool: poolName, Activity: a, Profile: profile, GPUs: gpus, Start: at(from), End: at(to)}
}

// req is a request on poolName holding its lease over [from, to].
func req(poolName, tenant string, from, to float64, prompt, completion int64) Request {
	return Request{Pool: poolName, Profile: "m", Tenant: tenant, Arrived: at(from), Ended: at(to), Duration: at(to).Sub(at(from)),
		PromptTokens: prompt, CompletionTokens: completion, Outcome: "completed", Status: 200}
}

// line finds the GPU-microseconds of (key, use, tenant) in rep.
func line(t *testing.T, rep *Report, key, use, tenant string) Row {
	t.Helper()
	for _, r := range rep.Rows {
		if r.Key == key && r.Use == use && r.Tenant == tenant {
			return r
		}
	}
	t.Fatalf("no line %q %q %q in %+v", key, use, tenant, rep.Rows)
	return Row{}
}

func TestSplitMicrosAddsUpAndIsProportional(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		total := rng.Int64N(1 << 50)
		ws := make([]int64, 1+rng.IntN(6))
		var sum int64
		for i := range ws {
			ws[i] = rng.Int64N(1 << 40)
			sum += ws[i]
		}
		if sum == 0 {
			ws[0], sum = 1, 1
		}
		parts := splitMicros(total, ws)
		var got int64
		for i, p := range parts {
			got += p
			exact := float64(total) * float64(ws[i]) / float64(sum)
			if d := float64(p) - exact; d < -1.5 || d > 1.5 {
				t.Fatalf("total %d weights %v: part %d = %d, proportional share %.1f", total, ws, i, p, exact)
			}
		}
		if got != total {
			t.Fatalf("total %d weights %v: parts %v add up to %d", total, ws, parts, got)
		}
	}
	if got := splitMicros(10, []int64{1, 1, 1}); !slices.Equal(got, []int64{4, 3, 3}) {
		t.Errorf("10 in three equal parts: %v, want the remainder to the first", got)
	}
}

func TestAttributeSharesServingTimeAndKeepsIdleApart(t *testing.T) {
	ivs := []Interval{
		iv("p0", activity.Empty, "", 0, 10, 0, 1),
		iv("p0", activity.Swapping, "m", 10, 20, 0, 1),
		iv("p0", activity.Serving, "m", 20, 60, 0, 1),
		iv("p0", activity.Idle, "m", 60, 100, 0, 1),
		iv("p1", activity.Serving, "m", 0, 30, 2),
		iv("p1", activity.Asleep, "m", 30, 100, 2),
	}
	reqs := []Request{
		// p0's serving interval: a 300 tokens, b 100 tokens.
		req("p0", "a", 20, 40, 100, 200), req("p0", "b", 30, 60, 50, 50),
		// p1's: only c, and zero tokens (a cut stream).
		req("p1", "c", 1, 29, 0, 0),
		// Reached no pool: counted, no GPU time.
		{Tenant: "a", Ended: at(50), Arrived: at(50), Outcome: "completed", Status: 404},
	}
	u := Attribute(ivs, reqs, t0, at(100), SplitTokens)
	rep := u.Report(ByPool, &Prices{GPUHour: 3.6, Currency: "EUR", PromptPerMillion: 1e6})
	// p0 has two GPUs: 40 s of serving is 80 GPU-s, 3:1 by tokens.
	if got := line(t, rep, "p0", UseServing, "a").GPUMicros; got != 60e6 {
		t.Errorf("p0 a: %d GPU-µs, want 60 s", got)
	}
	if got := line(t, rep, "p0", UseServing, "b").GPUMicros; got != 20e6 {
		t.Errorf("p0 b: %d GPU-µs, want 20 s", got)
	}
	for use, want := range map[string]int64{"empty": 20e6, "swapping": 20e6, "idle": 80e6} {
		if got := line(t, rep, "p0", use, "").GPUMicros; got != want {
			t.Errorf("p0 %s: %d GPU-µs, want %d", use, got, want)
		}
	}
	if got := line(t, rep, "p1", UseServing, "c").GPUMicros; got != 30e6 {
		t.Errorf("p1 c (zero tokens, by lease): %d GPU-µs, want 30 s", got)
	}
	if got := line(t, rep, "p1", "asleep", "").GPUMicros; got != 70e6 {
		t.Errorf("p1 asleep: %d, want 70 s", got)
	}
	if !rep.AddsUp() || len(rep.Pools) != 2 {
		t.Fatalf("checks: %+v", rep.Pools)
	}
	if p := rep.Pools[0]; p.GPUSeconds != 200 || p.CoveredSeconds != 100 || p.WindowSeconds != 100 {
		t.Errorf("p0 check %+v, want 200 GPU-s over the 100 s window", p)
	}
	// 3.6 per GPU-hour is 0.001 per GPU-second; a prompt token costs 1.
	if r := line(t, rep, "p0", UseServing, "a"); r.GPUCost < 0.0599 || r.GPUCost > 0.0601 || r.TokenCost != 100 || r.Requests != 1 {
		t.Errorf("p0 a priced %+v", r)
	}
	if r := line(t, rep, "", UseServing, "a"); r.Requests != 1 || r.Failed != 1 || r.GPUMicros != 0 {
		t.Errorf("the request that reached no pool: %+v", r)
	}
	if rep.Total.Requests != 4 || rep.Total.GPUMicros != 300e6 {
		t.Errorf("total %+v", rep.Total)
	}

	byTenant := u.Report(ByTenant, &Prices{})
	if r := line(t, byTenant, "a", UseServing, ""); r.GPUMicros != 60e6 || r.Requests != 2 {
		t.Errorf("by tenant, a: %+v", r)
	}
	if r := line(t, byTenant, "", "idle", ""); r.GPUMicros != 80e6 {
		t.Errorf("by tenant, idle: %+v", r)
	}
	if last := byTenant.Rows[len(byTenant.Rows)-1]; last.Key != "" {
		t.Errorf("by tenant: the pools' own lines come after the tenants; last row %+v", last)
	}
}

func TestAttributeByLeaseTime(t *testing.T) {
	ivs := []Interval{iv("p", activity.Serving, "m", 0, 40, 0)}
	reqs := []Request{req("p", "a", 0, 30, 1, 1), req("p", "b", 10, 40, 1000, 1000)}
	u := Attribute(ivs, reqs, t0, at(40), SplitLease)
	rep := u.Report(ByTenant, &Prices{})
	// Lease time: a 30 s, b 30 s.
	if a, b := line(t, rep, "a", UseServing, "").GPUMicros, line(t, rep, "b", UseServing, "").GPUMicros; a != 20e6 || b != 20e6 {
		t.Errorf("by lease: a %d, b %d; want 20 s each", a, b)
	}
}

func TestAttributeClipsTheWindowAndCutsDays(t *testing.T) {
	midnight := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	ivs := []Interval{
		{Pool: "p", Activity: activity.Serving, Profile: "m", GPUs: []int{0}, Start: midnight.Add(-time.Hour), End: midnight.Add(time.Hour)},
	}
	reqs := []Request{{Pool: "p", Tenant: "a", Arrived: midnight.Add(-time.Hour), Ended: midnight.Add(time.Hour), PromptTokens: 3, Outcome: "completed"}}
	// The window starts half an hour before midnight: half of the first
	// day's hour is in it.
	u := Attribute(ivs, reqs, midnight.Add(-30*time.Minute), midnight.Add(2*time.Hour), SplitTokens)
	rep := u.Report(ByDay, &Prices{})
	if r := line(t, rep, "2026-03-01", UseServing, "a"); r.GPUMicros != 1800e6 || r.Requests != 0 {
		t.Errorf("day 1: %+v", r)
	}
	if r := line(t, rep, "2026-03-02", UseServing, "a"); r.GPUMicros != 3600e6 || r.Requests != 1 {
		t.Errorf("day 2: %+v", r)
	}
	if p := rep.Pools[0]; !p.AddsUp || p.CoveredSeconds != 5400 {
		t.Errorf("check %+v", p)
	}
}

func TestAttributeMatchesRequestsToTheirServingInterval(t *testing.T) {
	ivs := []Interval{
		iv("p", activity.Serving, "m", 0, 10, 0),
		iv("p", activity.Idle, "m", 10, 20, 0),
		iv("p", activity.Serving, "m", 20, 30, 0),
		iv("p", activity.Serving, "m", 40, 50, 0), // its requests' rows were lost
	}
	// A request's end is a little after its lease's (the row is written
	// after the release), and it queued before it: what counts is the
	// lease, arrival plus queue wait.
	late := req("p", "b", 15, 30.001, 1, 1)
	late.QueueWait = 5 * time.Second
	reqs := []Request{req("p", "a", 0, 10.001, 1, 1), late}
	rep := Attribute(ivs, reqs, t0, at(50), SplitTokens).Report(ByPool, &Prices{})
	if a, b := line(t, rep, "p", UseServing, "a").GPUMicros, line(t, rep, "p", UseServing, "b").GPUMicros; a != 10e6 || b != 10e6 {
		t.Errorf("a %d, b %d; want 10 s each", a, b)
	}
	if r := line(t, rep, "p", UseUnattributed, ""); r.GPUMicros != 10e6 {
		t.Errorf("unattributed %+v", r)
	}
	if !rep.AddsUp() || rep.Pools[0].CoveredSeconds != 40 {
		t.Errorf("check %+v (10 s of the window are not covered)", rep.Pools)
	}
}

func TestAttributeFleetRowsKeepHostsApart(t *testing.T) {
	a := iv("gpu0", activity.Serving, "m", 0, 10, 0)
	a.Host = "h1"
	b := iv("gpu0", activity.Serving, "m", 0, 10, 0)
	b.Host = "h2"
	ra := req("gpu0", "x", 0, 10, 1, 0)
	ra.Host = "h1"
	rb := req("gpu0", "y", 0, 10, 1, 0)
	rb.Host = "h2"
	rep := Attribute([]Interval{a, b}, []Request{ra, rb}, t0, at(10), SplitTokens).Report(ByPool, &Prices{
		GPUHour: 1, Pools: []NamedPrice{{Name: "h2/gpu0", GPUHour: 2}}})
	if x, y := line(t, rep, "h1/gpu0", UseServing, "x"), line(t, rep, "h2/gpu0", UseServing, "y"); x.GPUMicros != 10e6 || y.GPUMicros != 10e6 || y.GPUCost != 2*x.GPUCost {
		t.Errorf("x %+v, y %+v", x, y)
	}
}

func TestPricesCheck(t *testing.T) {
	bad := Prices{Split: "coin", GPUHour: -1, Pools: []NamedPrice{{Name: "a", GPUHour: 1}, {Name: "a"}, {GPUHour: 2}}}
	err := bad.Check()
	if err == nil {
		t.Fatal("bad prices accepted")
	}
	for _, want := range []string{`split "coin"`, "gpu-hour: must not be negative", `pools[1]: "a" is listed twice`, "pools[2]: a name is required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	good := Prices{Split: "lease", GPUHour: 2, GPUModels: []NamedPrice{{Name: "NVIDIA H100 80GB HBM3", GPUHour: 4}}}
	if err := good.Check(); err != nil {
		t.Error(err)
	}
	if got := good.gpuHour("p", "NVIDIA H100 80GB HBM3"); got != 4 {
		t.Errorf("GPU model price %v, want 4", got)
	}
	if got := good.gpuHour("p", "other"); got != 2 {
		t.Errorf("default price %v, want 2", got)
	}
}
