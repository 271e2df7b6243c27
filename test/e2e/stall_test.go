package e2e

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An engine that stalls mid-stream (SIGSTOP) ends the stream with an error
// event after the stream idle timeout, instead of holding it until the
// client gives up; the pool stops the stalled engine, shows why, and the
// next request starts a fresh one.
func TestStalledEngineEndsTheStreamAndIsReplaced(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "20ms"}, Extra: map[string]any{"stopTimeout": "1s"}}}, nil),
		"--stream-idle-timeout", "2s")
	ready := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	started, results := d.streams(1, "m", 3000, 60*time.Second)
	waitStarted(t, started, 1)
	if err := syscall.Kill(ready.Engine.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(ready.Engine.PID, syscall.SIGCONT) })
	stopped := time.Now()

	r := <-results
	t.Logf("stream ended %s after the engine stopped", time.Since(stopped).Round(time.Millisecond))
	if r.err != nil && strings.Contains(r.err.Error(), "stream hung") || !strings.Contains(string(r.body), `"code":"engine_timeout"`) {
		t.Fatalf("the stalled stream: err %v, ends %q", r.err, tail(string(r.body), 2))
	}
	d.waitPool("p0", 30*time.Second, "the stalled engine stopped", func(p poolView) bool {
		return p.State == "failed" && strings.Contains(p.LastError, "stalled") && (p.Engine == nil || p.Engine.PID != ready.Engine.PID)
	})
	if left := groupAlive(ready.Engine.PID); len(left) > 0 {
		t.Fatalf("the stalled engine's group survived: %v", left)
	}
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("m", false, 2))
	if err != nil || code != http.StatusOK {
		t.Fatalf("the request after the stall: %d %v %s", code, err, body)
	}
}

// An engine that never gets ready answers its waiters at startupTimeout,
// not at startupTimeout plus the stop grace of an engine that ignores
// SIGTERM.
func TestUnreadyEngineAnswersAtStartupTimeout(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}},
		[]sim{{ID: "m", Flags: []string{"--sim-never-ready", "--sim-ignore-sigterm"},
			Extra: map[string]any{"startupTimeout": "2s", "stopTimeout": "60s"}}}, nil))
	start := time.Now()
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("m", false, 1))
	took := time.Since(start)
	if err != nil || code != http.StatusBadGateway || !strings.Contains(string(body), "startupTimeout") {
		t.Fatalf("a request for an engine that never gets ready: %d %v %s", code, err, body)
	}
	t.Logf("answered %s after the request (startupTimeout 2s, stopTimeout 60s)", took.Round(time.Millisecond))
	if took > 40*time.Second {
		t.Fatalf("answered after %s: the stop grace (60s) was waited for", took)
	}
	// The engine, which ignores SIGTERM, is still being stopped: a second
	// signal makes poold kill it and exit now.
	d.stopHurried()
}

// A profile whose engine binary does not exist on this host fails its
// requests at once with 502, before the pool drains anything: the loaded
// engine keeps serving. A profile that passes that check but fails to load
// leaves the pool to return to its default.
func TestPreflightKeepsTheLoadedEngine(t *testing.T) {
	tag := t.Name()
	profiles := profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "good", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{{ID: "good"}, {ID: "broken", Flags: []string{"--sim-fail-load"}},
			{ID: "missing", Extra: map[string]any{"command": []string{"no-such-engine-binary-" + tag, "serve", "--port", "{port}"}}}}, nil)
	d := startPoold(t, tag, profiles)
	good := d.waitPool("p0", 20*time.Second, "good ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "good" })

	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("missing", false, 1))
	if err != nil || code != http.StatusBadGateway || !strings.Contains(string(body), "does not resolve") {
		t.Fatalf("a request for a profile whose engine binary is missing: %d %v %s", code, err, body)
	}
	if p := d.pool("p0"); p.State != "ready" || p.Profile != "good" || p.Engine == nil || p.Engine.PID != good.Engine.PID {
		t.Fatalf("the failed preflight touched the pool: %+v", p)
	}
	if v := d.metricValue(`poold_swaps_total{from="good",pool="p0",result="failed",to="missing"}`); v > 0 {
		t.Fatalf("a swap to the missing profile was attempted")
	}

	code, _, body, err = d.post(context.Background(), "/v1/chat/completions", chatBody("broken", false, 1))
	if err != nil || code != http.StatusBadGateway {
		t.Fatalf("a request for a profile that fails to load: %d %v %s", code, err, body)
	}
	d.waitPool("p0", 30*time.Second, "back to its default", func(p poolView) bool { return p.State == "ready" && p.Profile == "good" })
}
