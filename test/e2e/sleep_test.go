package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// sleepSim is a sleep-enabled simulator profile: a 3 s cold load and a 0.2 s
// level-1 wake, as the acceptance criteria ask.
func sleepSim(id string, flags ...string) sim {
	return sim{
		ID:    id,
		Flags: append([]string{"--enable-sleep-mode", "--sim-load-delay", "3s", "--sim-wake-delay", "200ms", "--sim-ttft", "20ms"}, flags...),
		Extra: map[string]any{"sleep": map[string]any{"level": 1}, "weightBytes": 1000},
	}
}

// sleepStatus is one entry of a pool's /status "sleeping" list.
type sleepStatus struct {
	Profile   string    `json:"profile"`
	Level     int       `json:"level"`
	Since     time.Time `json:"since"`
	HostBytes int64     `json:"hostBytes"`
	PID       int       `json:"pid"`
}

func (d *daemon) sleeping(pool string) []sleepStatus {
	d.t.Helper()
	var p struct {
		Sleeping []sleepStatus `json:"sleeping"`
	}
	d.poolJSON(pool, &p)
	return p.Sleeping
}

// poolJSON decodes the named pool's entry of GET /status into v.
func (d *daemon) poolJSON(pool string, v any) {
	d.t.Helper()
	resp, err := http.Get(d.url + "/status")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Pools []json.RawMessage `json:"pools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		d.t.Fatal(err)
	}
	for _, raw := range st.Pools {
		var p struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			d.t.Fatal(err)
		}
		if p.Name == pool {
			if err := json.Unmarshal(raw, v); err != nil {
				d.t.Fatal(err)
			}
			return
		}
	}
	d.t.Fatalf("no pool %q", pool)
}

// logLines returns poold's JSON log lines whose msg contains msg.
func (d *daemon) logLines(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(d.stderr.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if s, _ := m["msg"].(string); strings.Contains(s, msg) {
			out = append(out, m)
		}
	}
	return out
}

// logLinesAtLeast is logLines once it has n records, or at a 30 s
// deadline: poold's stderr reaches the test through a pipe and a copying
// goroutine, after poold has written it.
func (d *daemon) logLinesAtLeast(msg string, n int) []map[string]any {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if l := d.logLines(msg); len(l) >= n || time.Now().After(deadline) {
			return l
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// engineLines returns the records of poold's JSON log that hold an engine
// output line (its field "line") containing s.
func (d *daemon) engineLines(s string) []map[string]any {
	var out []map[string]any
	for _, m := range d.logLines("engine output") {
		if l, _ := m["line"].(string); strings.Contains(l, s) {
			out = append(out, m)
		}
	}
	return out
}

// chat sends one non-streaming request and fails the test unless it gets 200.
func (d *daemon) chat(model string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, body, err := d.post(ctx, "/v1/chat/completions", chatBody(model, false, 2))
	if err != nil || code != http.StatusOK {
		d.t.Fatalf("request for %s: %d %s %v", model, code, body, err)
	}
}

// TestSleepAlternating: two clients per model keep a and b busy at once on
// one pool. The first swaps are cold starts, every later one a wake; the
// median swap is at least 10× faster; every request succeeds; and the
// simulator, which aborts (and logs) the requests in flight when /sleep
// comes while they run, never aborted one.
func TestSleepAlternating(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "300ms"}}},
		[]sim{sleepSim("a"), sleepSim("b")}, nil))
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })

	deadline := time.Now().Add(12 * time.Second)
	var mu sync.Mutex
	var failures []string
	var wg sync.WaitGroup
	requests := 0
	for _, model := range []string{"a", "a", "b", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				r := d.timedPost(context.Background(), chatBody(model, true, 4))
				mu.Lock()
				requests++
				if r.err != nil || r.code != http.StatusOK || !strings.HasSuffix(strings.TrimSpace(string(r.body)), "data: [DONE]") {
					failures = append(failures, model+": "+strings.TrimSpace(string(r.body)))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed, first: %s", len(failures), requests, failures[0])
	}

	var kinds []string
	took := map[string][]time.Duration{}
	for _, m := range d.logLines("engine ready") {
		kind, _ := m["kind"].(string)
		ns, _ := m["took"].(float64)
		kinds = append(kinds, kind)
		took[kind] = append(took[kind], time.Duration(ns))
	}
	if len(kinds) < 4 || !slices.Equal(kinds[:2], []string{"cold", "cold"}) || slices.Contains(kinds[2:], "cold") {
		t.Fatalf("swap kinds %v: want a and b cold, then only wakes", kinds)
	}
	cold, wake := median(took["cold"]), median(took["wake"])
	t.Logf("%d requests, %d swaps: cold p50 %v, wake p50 %v (%.0f×)", requests, len(kinds), cold, wake, float64(cold)/float64(wake))
	if wake*10 > cold {
		t.Errorf("wake p50 %v is not 10× faster than cold p50 %v", wake, cold)
	}

	// The simulator's own account: every /sleep found no request in flight.
	sleeps := d.engineLines("msg=sleeping")
	if len(sleeps) < len(took["wake"]) {
		t.Errorf("%d /sleep calls logged by the engines, want at least one per wake (%d)", len(sleeps), len(took["wake"]))
	}
	for _, m := range sleeps {
		if s := m["line"].(string); !strings.Contains(s, "aborted=0") {
			t.Errorf("a /sleep aborted requests in flight: %s", s)
		}
	}
	if n := len(d.engineLines("in-flight requests on sleep")); n > 0 {
		t.Errorf("the engines aborted in-flight requests on sleep %d times", n)
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestSleepBudget: the host RAM budget has room for one sleeper; a third
// profile evicts the least recently used sleeper with a full stop.
func TestSleepBudget(t *testing.T) {
	tag := t.Name()
	fast := func(id string) sim {
		s := sleepSim(id)
		s.Flags = append(s.Flags, "--sim-load-delay", "100ms")
		return s
	}
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s", "maxSleeping": 3}}},
		[]sim{fast("a"), fast("b"), fast("c")},
		map[string]any{"sleepMemoryBudget": 1500}))
	a := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" && p.Engine != nil })

	d.chat("b")
	sl := d.sleeping("p0")
	if len(sl) != 1 || sl[0].Profile != "a" || sl[0].PID != a.Engine.PID || sl[0].Level != 1 || sl[0].HostBytes != 1000 {
		t.Fatalf("sleeping after a→b: %+v, want a (pid %d, level 1, 1000 bytes)", sl, a.Engine.PID)
	}
	if !alive(a.Engine.PID) {
		t.Fatalf("sleeping engine a (pid %d) is not running", a.Engine.PID)
	}

	d.chat("c")
	sl = d.sleeping("p0")
	if len(sl) != 1 || sl[0].Profile != "b" {
		t.Fatalf("sleeping after b→c: %+v, want only b (a evicted)", sl)
	}
	if left := groupAlive(a.Engine.PID); len(left) > 0 {
		t.Errorf("evicted engine a left processes in its group: %v", left)
	}
	if v := d.metricValue(`poold_sleeping_engines{pool="p0"}`); v != 1 {
		t.Errorf("poold_sleeping_engines = %v, want 1", v)
	}
}

// TestSleepWakeFailure: an engine that refuses to wake is stopped, the
// profile starts cold, and the request succeeds.
func TestSleepWakeFailure(t *testing.T) {
	tag := t.Name()
	refusing := sleepSim("a", "--sim-refuse-wake", "--sim-load-delay", "100ms")
	fast := sleepSim("b", "--sim-load-delay", "100ms")
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{refusing, fast}, nil))
	a := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" && p.Engine != nil })
	d.chat("b")
	if sl := d.sleeping("p0"); len(sl) != 1 || sl[0].Profile != "a" {
		t.Fatalf("sleeping after a→b: %+v, want a", sl)
	}
	d.chat("a")
	p := d.pool("p0")
	if p.Profile != "a" || p.Engine == nil || p.Engine.PID == a.Engine.PID {
		t.Errorf("after the failed wake: %+v, want a on a new engine (not pid %d)", p, a.Engine.PID)
	}
	if left := groupAlive(a.Engine.PID); len(left) > 0 {
		t.Errorf("engine that failed to wake left processes: %v", left)
	}
	if v := d.metricValue(`poold_swaps_total{from="b",pool="p0",result="wake_failed",to="a"}`); v != 1 {
		t.Errorf(`poold_swaps_total{result="wake_failed"} = %v, want 1`, v)
	}
}
