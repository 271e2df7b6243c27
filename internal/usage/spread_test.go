package usage

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/poold/poold/internal/activity"
)

// spreadUsage: p0 serves model m to a (300 tokens), idles on m, serves n to
// b (100 tokens), swaps to n, is empty, then holds m and x asleep; p1 only
// idles, serving nobody.
func spreadUsage() *Usage {
	ivs := []Interval{
		iv("p0", activity.Serving, "m", 0, 40, 0),
		iv("p0", activity.Idle, "m", 40, 60, 0),
		iv("p0", activity.Serving, "n", 60, 80, 0),
		iv("p0", activity.Swapping, "n", 80, 90, 0),
		iv("p0", activity.Empty, "", 90, 95, 0),
		iv("p0", activity.Asleep, "m,x", 95, 100, 0),
		iv("p1", activity.Idle, "m", 0, 10, 1),
	}
	b := req("p0", "b", 60, 80, 50, 50)
	b.Profile = "n"
	return Attribute(ivs, []Request{req("p0", "a", 0, 40, 100, 200), b}, t0, at(100), SplitTokens)
}

func TestSpreadPoolTime(t *testing.T) {
	for _, tt := range []struct {
		how        Spread
		a, b       int64 // each tenant's shared GPU-µs on p0
		idleLeftP1 int64
	}{
		// 40 s of p0's own time, 3:1 by tokens.
		{SpreadTokens, 30e6, 10e6, 10e6},
		// idle on m to a, swapping to n to b, empty 3:1, asleep (m and x)
		// to a.
		{SpreadHolder, 20e6 + 3.75e6 + 5e6, 10e6 + 1.25e6, 10e6},
	} {
		u := spreadUsage()
		u.SpreadPoolTime(tt.how)
		rep := u.Report(ByPool, &Prices{GPUHour: 3.6})
		if !rep.AddsUp() {
			t.Errorf("%s: the pools' lines do not add up: %+v", tt.how, rep.Pools)
		}
		a, b := line(t, rep, "p0", UseServing, "a"), line(t, rep, "p0", UseServing, "b")
		if a.SharedMicros != tt.a || a.GPUMicros != 40e6+tt.a || b.SharedMicros != tt.b || b.GPUMicros != 20e6+tt.b {
			t.Errorf("%s: a %+v, b %+v; want shared %d and %d", tt.how, a.Counts, b.Counts, tt.a, tt.b)
		}
		for _, r := range rep.Rows {
			if r.Key == "p0" && r.Use != UseServing {
				t.Errorf("%s: p0 keeps a line of its own: %+v", tt.how, r)
			}
		}
		if got := line(t, rep, "p1", "idle", "").GPUMicros; got != tt.idleLeftP1 {
			t.Errorf("%s: p1, which served nobody, keeps its idle line: %d", tt.how, got)
		}
		// The cost follows the time: 0.001 per GPU-second.
		if d := a.GPUCost - float64(a.GPUMicros)/1e9; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: a's GPU cost %v for %d GPU-µs", tt.how, a.GPUCost, a.GPUMicros)
		}
		byTenant := u.Report(ByTenant, &Prices{GPUHour: 3.6})
		if r := line(t, byTenant, "a", UseServing, ""); r.GPUMicros != 40e6+tt.a {
			t.Errorf("%s: by tenant, a is one line with its share: %+v", tt.how, r)
		}
		if got := u.OfTenant("b").Report(ByTenant, &Prices{}); len(got.Rows) != 1 || got.Rows[0].SharedMicros != tt.b {
			t.Errorf("%s: b's own report: %+v", tt.how, got.Rows)
		}
	}
	u := spreadUsage()
	u.SpreadPoolTime(SpreadNone)
	if rep := u.Report(ByPool, &Prices{}); line(t, rep, "p0", "idle", "").GPUMicros != 20e6 || rep.Spread != SpreadNone {
		t.Errorf("no spread moved time: %+v", rep.Rows)
	}
	if _, err := ParseSpread("everyone"); err == nil {
		t.Error("an unknown spread accepted")
	}
}

func TestTableWithoutPricesLeavesCostOut(t *testing.T) {
	u := spreadUsage()
	var plain bytes.Buffer
	if err := u.Report(ByPool, &Prices{Currency: "USD"}).Write(&plain, FormatTable); err != nil {
		t.Fatal(err)
	}
	out := plain.String()
	if strings.Contains(out, "COST") || regexp.MustCompile(`(?m)\.\d{4}\s*$`).MatchString(out) {
		t.Errorf("a report without prices shows costs:\n%s", out)
	}
	for _, want := range []string{"; no prices set\n", "\nno prices set, so no cost columns: set usage-cost", "GPU SECONDS"} {
		if !strings.Contains(out, want) {
			t.Errorf("a report without prices does not say %q:\n%s", want, out)
		}
	}

	u.SpreadPoolTime(SpreadTokens)
	var priced bytes.Buffer
	if err := u.Report(ByTenant, &Prices{Currency: "EUR", GPUHour: 2}).Write(&priced, FormatTable); err != nil {
		t.Fatal(err)
	}
	out = priced.String()
	for _, want := range []string{"prices in EUR", "COST (EUR)", "SHARED GPU SECONDS", "spread over tenants by tokens"} {
		if !strings.Contains(out, want) {
			t.Errorf("a priced, spread report does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "no prices set") {
		t.Errorf("a priced report says no prices are set:\n%s", out)
	}
}
