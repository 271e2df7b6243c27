package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// idleView is what /status says of a pool's idle release.
type idleView struct {
	State         string        `json:"state"`
	Profile       *string       `json:"profile"`
	ReleaseAt     *time.Time    `json:"releaseAt"`
	ReleaseAction string        `json:"releaseAction"`
	Sleeping      []sleepStatus `json:"sleeping"`
}

func (d *daemon) idle(pool string) idleView {
	d.t.Helper()
	var v idleView
	d.poolJSON(pool, &v)
	return v
}

// withKeepAlive adds a keep_alive member, as written (raw JSON), to body.
func withKeepAlive(body, keepAlive string) string {
	return strings.Replace(body, "{", `{"keep_alive":`+keepAlive+",", 1)
}

// modelState is the state GET /v1/models gives model.
func (d *daemon) modelState(model string) string {
	d.t.Helper()
	resp, err := http.Get(d.url + "/v1/models")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct{ ID, State string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		d.t.Fatal(err)
	}
	for _, m := range list.Data {
		if m.ID == model {
			return m.State
		}
	}
	return ""
}

// waitMetric polls a metric until it reads want, failing after 10 s.
func (d *daemon) waitMetric(series string, want float64) {
	d.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for d.metricValue(series) != want {
		if time.Now().After(deadline) {
			d.t.Fatalf("%s = %v, want %v", series, d.metricValue(series), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIdleReleaseStop: the default, preloaded, is stopped at its
// idleTimeout: /status shows when and how beforehand, the engine's
// processes are gone after, the pool is empty, the model is listed as
// available (loadable, not loaded), the release is counted, and the next
// request starts the engine again.
func TestIdleReleaseStop(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a"}},
		[]sim{{ID: "a", Extra: map[string]any{"idleTimeout": "2s"}}}, nil))
	p := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" && p.Engine != nil })
	pid := p.Engine.PID
	if v := d.idle("p0"); v.ReleaseAt == nil || v.ReleaseAction != "stop" || time.Until(*v.ReleaseAt) > 2*time.Second {
		t.Fatalf("ready: releaseAt %v, action %q; want within 2s, stop", v.ReleaseAt, v.ReleaseAction)
	}
	d.waitPool("p0", 10*time.Second, "empty", func(p poolView) bool { return p.State == "empty" && p.Profile == "" && p.Engine == nil })
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the released engine's pid %d lives on", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := d.idle("p0"); v.ReleaseAt != nil || v.ReleaseAction != "" {
		t.Errorf("released: releaseAt %v, action %q; want none", v.ReleaseAt, v.ReleaseAction)
	}
	if s := d.modelState("a"); s != "available" {
		t.Errorf("/v1/models: a is %q, want available", s)
	}
	d.waitMetric(`poold_idle_releases_total{action="stop",pool="p0",profile="a"}`, 1)
	d.chat("a")
	if p := d.pool("p0"); p.State != "ready" || p.Profile != "a" {
		t.Fatalf("after a request: %+v, want a ready", p)
	}
}

// TestIdleReleaseSleep: a sleep-enabled default is put to sleep at its
// idleTimeout, the pool is empty with the engine asleep, the release is
// counted as a sleep, and the next request wakes it (no second cold start).
func TestIdleReleaseSleep(t *testing.T) {
	tag := t.Name()
	a := sleepSim("a", "--sim-load-delay", "100ms")
	a.Extra["idleTimeout"] = "2s"
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{a}, nil))
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	if v := d.idle("p0"); v.ReleaseAt == nil || v.ReleaseAction != "sleep" {
		t.Fatalf("ready: releaseAt %v, action %q; want one, sleep", v.ReleaseAt, v.ReleaseAction)
	}
	d.waitPool("p0", 10*time.Second, "empty", func(p poolView) bool { return p.State == "empty" && p.Profile == "" })
	if v := d.idle("p0"); len(v.Sleeping) != 1 || v.Sleeping[0].Profile != "a" || v.ReleaseAt != nil {
		t.Fatalf("released: sleeping %+v, releaseAt %v; want a asleep, no release due", v.Sleeping, v.ReleaseAt)
	}
	if s := d.modelState("a"); s != "available" {
		t.Errorf("/v1/models: a is %q, want available", s)
	}
	d.waitMetric(`poold_idle_releases_total{action="sleep",pool="p0",profile="a"}`, 1)
	d.chat("a")
	var kinds []string
	for _, m := range d.logLines("engine ready") {
		k, _ := m["kind"].(string)
		kinds = append(kinds, k)
	}
	if !slices.Equal(kinds, []string{"cold", "wake"}) {
		t.Fatalf("engine ready kinds %v, want cold, then a wake", kinds)
	}
}

// TestRequestKeepAlive: a request's keep_alive sets when its engine is released,
// on a profile that never releases on its own; the access log records it;
// keep_alive 0 releases once the answer is complete; a keep_alive that is
// neither a number nor a duration is a 400 naming it, before any engine
// starts.
func TestRequestKeepAlive(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}, {Name: "p1", GPUs: []int{1}}},
		[]sim{{ID: "a", Pools: []string{"p0"}}, {ID: "b", Pools: []string{"p1"}}}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, bad := range []string{`"forever"`, `true`, `{"s":1}`} {
		code, _, body, err := d.post(ctx, "/v1/chat/completions", withKeepAlive(chatBody("b", false, 2), bad))
		var e struct {
			Error struct{ Param string }
		}
		if err != nil || code != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error.Param != "keep_alive" {
			t.Errorf("keep_alive %s: %d %s %v, want a 400 naming keep_alive", bad, code, body, err)
		}
	}
	if p := d.pool("p1"); p.State != "empty" || len(d.logLines("starting engine")) != 0 {
		t.Fatalf("after the refusals: p1 %+v, %d engine starts; want it empty, none", p, len(d.logLines("starting engine")))
	}

	code, hdr, body, err := d.post(ctx, "/v1/chat/completions", withKeepAlive(chatBody("a", false, 2), `"10m"`))
	if err != nil || code != http.StatusOK {
		t.Fatalf("keep_alive 10m: %d %s %v", code, body, err)
	}
	if v := d.idle("p0"); v.ReleaseAt == nil || v.ReleaseAction != "stop" || time.Until(*v.ReleaseAt) < 9*time.Minute || time.Until(*v.ReleaseAt) > 10*time.Minute {
		t.Fatalf("after keep_alive 10m: releaseAt %v, action %q; want about 10m on, stop", v.ReleaseAt, v.ReleaseAction)
	}
	if rec := waitLogLine(t, d, hdr.Get("X-Request-Id")); rec["keep_alive_ms"] != 600000.0 {
		t.Errorf("access log keep_alive_ms %v, want 600000", rec["keep_alive_ms"])
	}

	code, _, body, err = d.post(ctx, "/v1/chat/completions", withKeepAlive(chatBody("a", false, 2), `0`))
	if err != nil || code != http.StatusOK {
		t.Fatalf("keep_alive 0: %d %s %v", code, body, err)
	}
	d.waitPool("p0", 10*time.Second, "empty after keep_alive 0", func(p poolView) bool { return p.State == "empty" && p.Engine == nil })
	d.waitMetric(`poold_idle_releases_total{action="stop",pool="p0",profile="a"}`, 1)
}

// TestIdleReleaseNeverCutsStream: a stream outlasts the idleTimeout many
// times over, and a request with keep_alive 0 ends while it is in flight;
// the stream still arrives whole, and the release comes only once it ended.
func TestIdleReleaseNeverCutsStream(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}},
		[]sim{{ID: "a", Flags: []string{"--sim-itl", "50ms"}, Extra: map[string]any{"idleTimeout": "200ms"}}}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const tokens = 40 // 2 s of stream
	done := make(chan result, 1)
	go func() { done <- d.timedPost(ctx, withKeepAlive(chatBody("a", true, tokens), "0")) }()
	d.waitPool("p0", 10*time.Second, "the stream in flight", func(p poolView) bool { return p.InFlight == 1 })
	code, _, body, err := d.post(ctx, "/v1/chat/completions", withKeepAlive(chatBody("a", false, 1), "0"))
	if err != nil || code != http.StatusOK {
		t.Fatalf("keep_alive 0 beside the stream: %d %s %v", code, body, err)
	}
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the stream did not end")
	}
	if r.err != nil || r.code != http.StatusOK {
		t.Fatalf("stream: %d %s %v", r.code, r.body, r.err)
	}
	checkStream(t, r.body, "a", tokens)
	d.waitPool("p0", 10*time.Second, "empty after the stream", func(p poolView) bool { return p.State == "empty" })
	d.waitMetric(`poold_idle_releases_total{action="stop",pool="p0",profile="a"}`, 1)
}

// TestRequestKeepAliveNotForwarded: the engine never sees keep_alive (vLLM does
// not know it); the rest of the body reaches it.
func TestRequestKeepAliveNotForwarded(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}}}, []sim{helperSim(tag, "h", "log-body")}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, body, err := d.post(ctx, "/v1/chat/completions", withKeepAlive(chatBody("h", false, 2), `"5m"`))
	if err != nil || code != http.StatusOK {
		t.Fatalf("%d %s %v", code, body, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(d.engineLines("received")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the engine logged no body")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, m := range d.engineLines("received") {
		if l, _ := m["line"].(string); strings.Contains(l, "keep_alive") || !strings.Contains(l, `"max_tokens":2`) {
			t.Errorf("the engine received %s: want the body without keep_alive", l)
		}
	}
}
