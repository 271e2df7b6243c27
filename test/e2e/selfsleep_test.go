package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestSleepByItself: the pool's engine sleeps by itself once idle for 300
// ms (the idle sleep of the newest vLLM servers, simulated). poold notices
// it in the engine's metrics, shows it asleep in /status and counts it,
// and the next request is answered 200 after poold woke the engine itself
// with /wake_up: the simulator's own wake for a request that reaches it
// asleep never comes first.
func TestSleepByItself(t *testing.T) {
	tag := t.Name()
	a := sleepSim("a", "--sim-load-delay", "100ms", "--sim-idle-sleep", "300ms")
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{a}, nil), "--engine-metrics-interval", "100ms")
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	d.chat("a")

	type sleeper struct {
		Profile   string `json:"profile"`
		Level     int    `json:"level"`
		SelfSlept bool   `json:"selfSlept"`
	}
	var p struct {
		State    string    `json:"state"`
		Sleeping []sleeper `json:"sleeping"`
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		d.poolJSON("p0", &p)
		if p.State == "empty" && len(p.Sleeping) == 1 && p.Sleeping[0].SelfSlept {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no engine asleep by itself in /status within 20s: %+v", p)
		}
	}
	if sl := p.Sleeping[0]; sl.Profile != "a" || sl.Level != 1 {
		t.Errorf("sleeper %+v, want a at level 1", sl)
	}
	if n := d.metricValue(`poold_engine_self_sleeps_total{action="wake",pool="p0"}`); n < 1 {
		t.Errorf("poold_engine_self_sleeps_total{action=wake} = %v, want at least 1", n)
	}
	if len(d.logLines("engine fell asleep by itself")) == 0 {
		t.Error("poold logged no engine asleep by itself")
	}

	d.chat("a")

	// The engine's own account, in order: it slept by itself, then poold
	// woke it (POST /wake_up: "woke up"), before any request reached it
	// asleep (which the simulator would wake for: "woke up for a request").
	// Its lines reach poold's log through a pipe: wait for the wake's.
	var order []string
	for deadline := time.Now().Add(20 * time.Second); len(order) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		order = nil
		for _, m := range d.logLines("engine output") {
			line, _ := m["line"].(string)
			switch {
			case strings.Contains(line, "sleeping after idle time"):
				order = append(order, "self-sleep")
			case strings.Contains(line, `msg="woke up"`):
				order = append(order, "woken by poold")
			case strings.Contains(line, "woke up for a request"):
				order = append(order, "woke for a request")
			}
		}
	}
	if len(order) < 2 || order[0] != "self-sleep" || order[1] != "woken by poold" {
		t.Errorf("the engine's sleeps and wakes, in order: %v; want a self-sleep, then poold's wake", order)
	}
	var woken bool
	for _, m := range d.logLines("engine ready") {
		woken = woken || m["kind"] == "wake"
	}
	if !woken {
		t.Error("no wake logged by poold (engine ready, kind wake)")
	}
}
