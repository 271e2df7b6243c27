package e2e

// An engine that dies at its first request, every time (docs/operations.md,
// "A model loads, then its engine dies at its first request").

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// failing is the pool's failing profile in /status, nil when none.
func (d *daemon) failing(name string) *statusapi.Failing {
	d.t.Helper()
	resp, err := http.Get(d.url + "/status")
	if err != nil {
		d.t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	var st statusapi.Poold
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		d.t.Fatalf("decoding /status: %v", err)
	}
	for _, p := range st.Pools {
		if p.Name == name {
			return p.Failing
		}
	}
	d.t.Fatalf("no pool %q in /status", name)
	return nil
}

// admin posts body to the admin API's path with the admin token "s3cret".
func (d *daemon) admin(path, body string) (int, http.Header, []byte) {
	d.t.Helper()
	req, err := http.NewRequestWithContext(d.t.Context(), http.MethodPost, d.url+path, strings.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// A model whose engine starts, becomes ready and dies of its first request,
// every time (vLLM's CPU build given a head size it has no kernel for):
// the first two requests get errors, the requests in flight on the dying
// engine too, each death costing a start. Then the profile is held
// failing: its requests get 503 engine_backoff at once, with Retry-After
// and the engine's own reason, /status shows it failing, and no engine
// starts, until the operator clears the backoff. A changed profile that
// works serves, and a crash after its first success is a crash.
func TestFirstRequestDeathHoldsTheProfile(t *testing.T) {
	tag := t.Name()
	pools := []pool{{Name: "p0", GPUs: []int{0}}}
	dies := []string{"--sim-die-on-first-request", "--sim-load-delay", "300ms", "--sim-watchdog-interval", "100ms"}
	d := startPoold(t, tag, profilesJSON(tag, pools, []sim{{ID: "m", Flags: dies}}, nil),
		"--restart-backoff", "1m", "--restart-backoff-max", "5m", "--engine-health-interval", "100ms",
		"--admin-token-file", adminTokenFile(t, "s3cret"))
	const (
		starts  = `poold_engine_starts_total{pool="p0",profile="m",result="ok"}`
		deaths  = `poold_engine_exits_total{pool="p0",profile="m",reason="first_request_failed"}`
		crashes = `poold_engine_exits_total{pool="p0",profile="m",reason="crashed"}`
		reason  = "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=1"
	)
	// ask sends n requests at once and returns their statuses and bodies;
	// a hang fails the test.
	ask := func(n int) (codes []int, bodies []string) {
		t.Helper()
		type answer struct {
			code int
			body string
			err  error
		}
		answers := make(chan answer, n)
		for range n {
			go func() {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				code, _, body, err := d.post(ctx, "/v1/chat/completions", chatBody("m", false, 2))
				answers <- answer{code, string(body), err}
			}()
		}
		for range n {
			a := <-answers
			if a.err != nil {
				t.Fatalf("a request for m: %v", a.err)
			}
			codes, bodies = append(codes, a.code), append(bodies, a.body)
		}
		return codes, bodies
	}

	// Two deaths in a row: the first with two requests in flight on it.
	for death, n := range []int{2, 1} {
		codes, bodies := ask(n)
		for i, code := range codes {
			// The engine's own 500, passed on, or poold's 502 once the
			// engine is gone.
			if code != http.StatusInternalServerError && code != http.StatusBadGateway ||
				code == http.StatusInternalServerError && !strings.Contains(bodies[i], "EngineCore encountered an issue") {
				t.Fatalf("death %d: a request got %d %s; want the engine's 500 or a 502", death+1, code, bodies[i])
			}
		}
		d.waitMetric(deaths, float64(death+1))
	}
	if n := d.metricValue(starts); n != 2 {
		t.Fatalf("%v engine starts for two deaths, want 2", n)
	}

	// Held: refused at once, with the engine's reason.
	for range 3 {
		code, hdr, body, err := d.post(t.Context(), "/v1/chat/completions", chatBody("m", false, 2))
		if err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("a request after two deaths: %d %v %s; want 503", code, err, body)
		}
		e := apiError(t, body)
		for _, want := range []string{"after 2 consecutive failures", `engine "m" died at its first request, before any succeeded`, "reason: " + reason} {
			if !strings.Contains(e.Error.Message, want) {
				t.Fatalf("the refusal's message lacks %q: %s", want, body)
			}
		}
		ra, err := strconv.Atoi(hdr.Get("Retry-After"))
		if e.Error.Code != "engine_backoff" || hdr.Get("X-Poold-Refused") != "engine_backoff" || err != nil || ra < 1 || ra > 60 {
			t.Fatalf("refusal: code %v, X-Poold-Refused %q, Retry-After %q; want engine_backoff, within 1m", e.Error.Code, hdr.Get("X-Poold-Refused"), hdr.Get("Retry-After"))
		}
	}
	f := d.failing("p0")
	if f == nil || f.Profile != "m" || f.Failures != 2 || f.Exit != statusapi.ExitFirstRequest || f.Reason != reason ||
		!strings.Contains(f.LastError, "died at its first request") || f.RetryAt == nil || !f.RetryAt.After(time.Now()) {
		t.Fatalf("/status failing: %+v; want m, 2 deaths at the first request, the reason, a retry ahead", f)
	}
	if p := d.pool("p0"); p.State != "failed" || p.Engine != nil {
		t.Fatalf("pool while held: %+v", p)
	}
	// An explicit load is refused the same way.
	if code, _, body := d.admin("/admin/pools/p0/load", `{"profile": "m"}`); code != http.StatusServiceUnavailable || apiError(t, body).Error.Code != "engine_backoff" {
		t.Fatalf("admin load while held: %d %s", code, body)
	}
	if n := d.metricValue(starts); n != 2 {
		t.Fatalf("%v engine starts while held, want 2", n)
	}

	// The operator clears it: the next request starts the engine again.
	code, _, body := d.admin("/admin/pools/p0/clear-backoff", "")
	var st statusapi.Pool
	if code != http.StatusOK || json.Unmarshal(body, &st) != nil || st.Failing != nil {
		t.Fatalf("clear-backoff: %d %s", code, body)
	}
	if codes, bodies := ask(1); codes[0] != http.StatusInternalServerError && codes[0] != http.StatusBadGateway {
		t.Fatalf("the request after the clear: %d %s; want the engine's death", codes[0], bodies[0])
	}
	d.waitMetric(deaths, 3)
	if n := d.metricValue(starts); n != 3 {
		t.Fatalf("%v engine starts after the clear, want 3", n)
	}
	if f := d.failing("p0"); f == nil || f.Failures != 1 || f.RetryAt != nil {
		t.Fatalf("/status failing after the clear and one more death: %+v; want 1 failure, no wait", f)
	}

	// A changed profile that works serves at once.
	good := profilesJSON(tag, pools, []sim{{ID: "m", Flags: []string{"--sim-watchdog-interval", "100ms"}}}, nil)
	writeFile(t, d.profiles, good)
	d.waitConfig(good, 5*time.Second, "the changed profile")
	d.chat("m")
	ready := d.waitPool("p0", 5*time.Second, "ready", func(p poolView) bool { return p.State == "ready" && p.LastError == "" })
	if f := d.failing("p0"); f != nil {
		t.Fatalf("/status failing with the changed profile ready: %+v", f)
	}
	// Once it answered a request, its death is a crash.
	if err := syscall.Kill(ready.Engine.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.waitMetric(crashes, 1)
	if n := d.metricValue(deaths); n != 3 {
		t.Fatalf("%v deaths at the first request after a served engine's crash, want 3", n)
	}
}
