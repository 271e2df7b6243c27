package e2e

// Fault injection (docs/reliability.md): engines killed, crash-looping, hung or
// unable to bind; poold itself stopped under load; unwritable log and state
// paths.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// streamOutcome is what one streaming client got.
type streamOutcome struct {
	code int
	body []byte
	err  error
}

// streams starts n streaming chats for model, each with its own deadline so
// that a hang fails the test instead of blocking it. started gets a value once
// each stream's first byte arrived (or it failed before).
func (d *daemon) streams(n int, model string, tokens int, deadline time.Duration) (started <-chan struct{}, results <-chan streamOutcome) {
	first := make(chan struct{}, n)
	out := make(chan streamOutcome, n)
	for range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			o := d.stream(ctx, model, tokens, first)
			if ctx.Err() != nil {
				o.err = fmt.Errorf("stream hung: %w", ctx.Err())
			}
			out <- o
		}()
	}
	return first, out
}

func (d *daemon) stream(ctx context.Context, model string, tokens int, first chan<- struct{}) streamOutcome {
	signaled := false
	defer func() {
		if !signaled {
			first <- struct{}{}
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody(model, true, tokens)))
	if err != nil {
		return streamOutcome{err: err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamOutcome{err: err}
	}
	defer resp.Body.Close()
	b := make([]byte, 1)
	if _, err := io.ReadFull(resp.Body, b); err != nil {
		return streamOutcome{code: resp.StatusCode, err: err}
	}
	first <- struct{}{}
	signaled = true
	rest, err := io.ReadAll(resp.Body)
	return streamOutcome{resp.StatusCode, append(b, rest...), err}
}

// waitStarted waits for n streams' first bytes.
func waitStarted(t *testing.T, started <-chan struct{}, n int) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for range n {
		select {
		case <-started:
		case <-timeout:
			t.Fatalf("streams did not start within 20s")
		}
	}
}

// apiError decodes an OpenAI error body, failing the test if it is not one.
func apiError(t *testing.T, body []byte) apiErr {
	t.Helper()
	var e apiErr
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == nil {
		t.Fatalf("not an OpenAI error body: %s", body)
	}
	return e
}

// An engine SIGKILLed with several streams in flight: every client's stream
// ends with poold's error event (never [DONE], never a hang), the leases are
// freed, /status shows the failure, and the next request starts a new engine.
func TestEngineKilledMidStreamEndsEveryStream(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "20ms"}}}, nil))
	ready := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	const n = 4
	started, results := d.streams(n, "m", 1000, 30*time.Second)
	waitStarted(t, started, n)
	if err := syscall.Kill(ready.Engine.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range n {
		r := <-results
		if r.code != http.StatusOK {
			t.Fatalf("stream status %d", r.code)
		}
		if r.err != nil && strings.Contains(r.err.Error(), "stream hung") {
			t.Fatalf("a stream hung after its engine was killed")
		}
		if strings.Contains(string(r.body), "[DONE]") || !strings.Contains(string(r.body), `"engine_stream_failed"`) {
			t.Fatalf("stream did not end with poold's error event (err %v):\n%s", r.err, tail(string(r.body), 3))
		}
	}
	failed := d.waitPool("p0", 5*time.Second, "leases freed and failure shown", func(p poolView) bool {
		return p.InFlight == 0 && p.State == "failed" && strings.Contains(p.LastError, "signal: killed")
	})
	if failed.Engine != nil {
		t.Fatalf("a dead engine is still shown: %+v", failed.Engine)
	}
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("m", false, 3))
	if err != nil || code != http.StatusOK {
		t.Fatalf("request after the kill: %d %v %s", code, err, body)
	}
	again := d.waitPool("p0", 5*time.Second, "ready again", func(p poolView) bool { return p.State == "ready" && p.LastError == "" })
	if again.Engine == nil || again.Engine.PID == ready.Engine.PID {
		t.Fatalf("no new engine after the kill: %+v", again.Engine)
	}
}

// backoffMsg matches the 503 of a pool backing off a crash-looping profile.
var backoffMsg = regexp.MustCompile(`after (\d+) consecutive failures \(next start in ([0-9.]+m?s)\)`)

// An engine that dies right after it becomes ready, again and again: its
// restarts back off exponentially up to the cap, requests meanwhile get a 503
// naming the last error with Retry-After at once, and a good profile landing
// through reload recovers the pool.
func TestCrashLoopBacksOffAndRecoversOnReload(t *testing.T) {
	tag := t.Name()
	pools := []pool{{Name: "p0", GPUs: []int{0}}}
	d := startPoold(t, tag, profilesJSON(tag, pools,
		[]sim{{ID: "loop", Flags: []string{"--sim-exit-after-ready", "150ms"}}}, nil),
		"--restart-backoff", "200ms", "--restart-backoff-max", "800ms")

	const base, cap = 200 * time.Millisecond, 800 * time.Millisecond
	maxFailures, refusals := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for maxFailures < 5 || refusals < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("crash loop: saw %d failures and %d refusals in 60s", maxFailures, refusals)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		code, hdr, body, err := d.post(ctx, "/v1/chat/completions", chatBody("loop", false, 1))
		cancel()
		if err != nil {
			t.Fatalf("request during the crash loop: %v", err)
		}
		switch code {
		case http.StatusOK, http.StatusBadGateway:
			// Served in the engine's short life, or cut by its death.
			d.waitPool("p0", 5*time.Second, "engine dead", func(p poolView) bool { return p.State == "failed" })
			continue
		case http.StatusServiceUnavailable:
		default:
			t.Fatalf("unexpected answer %d: %s", code, body)
		}
		e := apiError(t, body)
		m := backoffMsg.FindStringSubmatch(e.Error.Message)
		if e.Error.Code != "engine_backoff" || m == nil || !strings.Contains(e.Error.Message, "simulated engine death") {
			t.Fatalf("503 does not give the backoff and the last error: %s", body)
		}
		if ra, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || ra < 1 || time.Duration(ra)*time.Second > cap+time.Second {
			t.Fatalf("Retry-After %q with a cap of %s", hdr.Get("Retry-After"), cap)
		}
		failures, _ := strconv.Atoi(m[1])
		left, _ := time.ParseDuration(m[2])
		// The n-th consecutive failure waits base·2^(n-2), capped.
		want := min(base<<(failures-2), cap)
		if failures < 2 || left > want {
			t.Fatalf("after %d failures the next start is in %s; want at most %s", failures, left, want)
		}
		maxFailures = max(maxFailures, failures)
		refusals++
		// A refusal starts nothing; the loop polls on until the backoff passes.
		if p := d.pool("p0"); p.State != "failed" || p.Engine != nil {
			t.Fatalf("a refused request touched the pool: %+v", p)
		}
		time.Sleep(10 * time.Millisecond)
	}

	good := profilesJSON(tag, pools, []sim{{ID: "loop", Flags: []string{"--sim-itl", "20ms"}}}, nil)
	writeFile(t, d.profiles, good)
	d.waitConfig(good, 5*time.Second, "good profile")
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("loop", false, 2))
	if err != nil || code != http.StatusOK {
		t.Fatalf("request after the good profile landed: %d %v %s", code, err, body)
	}
	p := d.waitPool("p0", 5*time.Second, "ready", func(p poolView) bool { return p.State == "ready" && p.LastError == "" })
	// It stays up: a stream of 30 tokens at 20ms outlives the old engines'
	// 150ms four times over.
	_, results := d.streams(1, "loop", 30, 20*time.Second)
	r := <-results
	if r.err != nil || r.code != http.StatusOK {
		t.Fatalf("stream on the recovered engine: %d %v", r.code, r.err)
	}
	checkStream(t, r.body, "loop", 30)
	if now := d.pool("p0"); now.Engine == nil || now.Engine.PID != p.Engine.PID || now.State != "ready" {
		t.Fatalf("the recovered engine did not last: %+v", now)
	}
}

// A ready engine that accepts requests but never answers: the request ends
// with a 504 after upstream-header-timeout and frees its lease. An engine that
// never answers its readiness probes fails at startupTimeout.
func TestHungEngineTimesOut(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}, {Name: "p1", GPUs: []int{1}}},
		[]sim{
			{ID: "hung", Pools: []string{"p0"}, Flags: []string{"--sim-hang-requests"}},
			{ID: "mute", Pools: []string{"p1"}, Flags: []string{"--sim-hang"}, Extra: map[string]any{"startupTimeout": "1s"}},
		}, nil),
		"--upstream-header-timeout", "500ms")

	for _, stream := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		code, _, body, err := d.post(ctx, "/v1/chat/completions", chatBody("hung", stream, 3))
		cancel()
		if err != nil {
			t.Fatalf("stream=%t: %v", stream, err)
		}
		if e := apiError(t, body); code != http.StatusGatewayTimeout || e.Error.Code != "engine_timeout" {
			t.Fatalf("stream=%t: got %d %s, want 504 engine_timeout", stream, code, body)
		}
		d.waitPool("p0", 5*time.Second, "lease freed", func(p poolView) bool { return p.InFlight == 0 && p.State == "ready" })
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, _, body, err := d.post(ctx, "/v1/chat/completions", chatBody("mute", false, 3))
	if err != nil || code != http.StatusBadGateway || !strings.Contains(string(body), "not ready after startupTimeout 1s") {
		t.Fatalf("mute engine: %d %v %s", code, err, body)
	}
}

// portCommand is a simulator command line whose --port is port; the {port}
// placeholder, which the profile requires, sits in a shell comment. The
// simulator reports a taken port as vLLM does, by message: "old" (Python's
// "[Errno 98] Address already in use") or "new" ("Port N is already in use").
func portCommand(port, marker, message string) []string {
	sim := `exec {poold} engine-sim /models/x --served-model-name {id} --sim-port-message ` + message + ` --port `
	script := sim + port + ` # {port}`
	if marker != "" {
		// The first start takes the held port, later ones the one poold chose.
		script = `if mkdir ` + marker + ` 2>/dev/null; then ` + sim + port + `; else ` + sim + `{port}; fi`
	}
	return []string{"sh", "-c", script}
}

// Something else holds the engine's port: poold starts the engine again on
// another port, a bounded number of times, and says so when it gives up;
// either of vLLM's messages for it is understood.
func TestPortConflict(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	marker := filepath.Join(t.TempDir(), "first-start")

	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}, {Name: "p1", GPUs: []int{1}}},
		[]sim{
			{ID: "once", Pools: []string{"p0"}, Extra: map[string]any{"command": portCommand(port, marker, "old")}},
			{ID: "always", Pools: []string{"p1"}, Extra: map[string]any{"command": portCommand(port, "", "new")}},
		}, nil))

	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("once", false, 2))
	if err != nil || code != http.StatusOK {
		t.Fatalf("engine whose first port was taken: %d %v %s", code, err, body)
	}
	if !strings.Contains(d.stderr.String(), "engine's port was taken; starting it on another") {
		t.Fatalf("the retry was not logged")
	}
	if p := d.pool("p0"); p.Engine == nil || strconv.Itoa(p.Engine.Port) == port {
		t.Fatalf("engine not on a new port: %+v", p.Engine)
	}

	code, _, body, err = d.post(context.Background(), "/v1/chat/completions", chatBody("always", false, 2))
	if err != nil || code != http.StatusBadGateway {
		t.Fatalf("engine whose port is always taken: %d %v %s", code, err, body)
	}
	msg := apiError(t, body).Error.Message
	if !strings.Contains(msg, "found its port taken 3 times in a row") || !strings.Contains(msg, "Port "+port+" is already in use") {
		t.Fatalf("unclear failure: %s", msg)
	}
}

// SIGTERM with streams in flight: the listener stays open and new requests get
// 503 shutting_down while the streams complete; poold exits 0 and leaves no
// process behind (the harness checks at cleanup).
func TestShutdownUnderLoadDrains(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "25ms", "--sim-spawn-child"}}}, nil),
		"--shutdown-timeout", "30s")
	ready := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	const n = 3
	started, results := d.streams(n, "m", 60, 30*time.Second)
	waitStarted(t, started, n)
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// New requests during the drain are answered, with 503 shutting_down.
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, hdr, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("m", false, 1))
		if err != nil {
			t.Fatalf("a request during the drain was not answered: %v", err)
		}
		if code == http.StatusServiceUnavailable {
			if e := apiError(t, body); e.Error.Code != "shutting_down" || hdr.Get("Retry-After") == "" {
				t.Fatalf("503 during the drain: %s (Retry-After %q)", body, hdr.Get("Retry-After"))
			}
			break
		}
		if code != http.StatusOK || time.Now().After(deadline) {
			t.Fatalf("request during the drain: %d %s", code, body)
		}
	}
	if p := d.pool("p0"); p.InFlight != n {
		t.Fatalf("the streams ended before the 503 was seen: in flight %d", p.InFlight)
	}
	for range n {
		r := <-results
		if r.err != nil || r.code != http.StatusOK {
			t.Fatalf("stream during the drain: %d %v", r.code, r.err)
		}
		checkStream(t, r.body, "m", 60)
	}
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("poold did not exit after the drain")
	}
	if d.err != nil {
		t.Fatalf("poold exit: %v", d.err)
	}
	if left := groupAlive(ready.Engine.PID); len(left) > 0 {
		t.Fatalf("engine group survived shutdown: %v", left)
	}
}

// A stream longer than the drain bound is cut when the bound passes, and
// poold still exits 0 with nothing left behind.
func TestShutdownDrainBound(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "20ms"}}}, nil),
		"--shutdown-timeout", "300ms")
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	started, results := d.streams(1, "m", 3000, 30*time.Second)
	waitStarted(t, started, 1)
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := <-results
	if strings.Contains(string(r.body), "[DONE]") || (r.err != nil && strings.Contains(r.err.Error(), "stream hung")) {
		t.Fatalf("a stream past the drain bound: err %v, body ends %q", r.err, tail(string(r.body), 2))
	}
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("poold did not exit after the drain bound")
	}
	if d.err != nil {
		t.Fatalf("poold exit: %v", d.err)
	}
	if !strings.Contains(d.stderr.String(), "drain bound reached with requests in flight") {
		t.Fatalf("the cut was not logged")
	}
}

// Log and state paths that cannot be written: a path that cannot be opened
// stops poold at start-up with a clear error; a disk that fills up (the
// access log on /dev/full) or a state directory removed mid-traffic degrade
// with a warning while requests keep being served.
func TestUnwritablePaths(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	writeFile(t, notDir, []byte("x"))

	t.Run("access log cannot be opened", func(t *testing.T) {
		tag := t.Name()
		d := launch(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "m"}}, nil),
			"--access-log", filepath.Join(notDir, "access.log"))
		select {
		case <-d.exited:
		case <-time.After(20 * time.Second):
			t.Fatal("poold did not exit")
		}
		if d.err == nil || !strings.Contains(d.stderr.String(), "opening access log") || !strings.Contains(d.stderr.String(), "not a directory") {
			t.Fatalf("exit %v; stderr:\n%s", d.err, d.stderr.String())
		}
	})

	t.Run("disk full and state dir gone", func(t *testing.T) {
		if _, err := os.Stat("/dev/full"); err != nil {
			t.Skip("no /dev/full")
		}
		tag := t.Name()
		state := filepath.Join(t.TempDir(), "state")
		d := startPoold(t, tag, profilesJSON(tag,
			[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s"}}},
			[]sim{{ID: "a"}, {ID: "b"}}, nil),
			"--access-log", "/dev/full", "--state-dir", state)
		d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
		if err := os.RemoveAll(state); err != nil {
			t.Fatal(err)
		}
		// Swaps write the state file; every request writes an access-log line.
		for i, model := range []string{"a", "b", "a", "b"} {
			code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody(model, i%2 == 0, 2))
			if err != nil || code != http.StatusOK {
				t.Fatalf("request %d: %d %v %s", i, code, err, body)
			}
		}
		// Access-log lines are written behind a queue: wait for the warning.
		deadline := time.Now().Add(10 * time.Second)
		logs := d.stderr.String()
		for !strings.Contains(logs, "no space left on device") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			logs = d.stderr.String()
		}
		// Four lost lines within the warning's 10 s interval: one warning.
		if strings.Count(logs, "access log lines dropped") != 1 || !strings.Contains(logs, "no space left on device") {
			t.Fatalf("want one warning about the access log; stderr:\n%s", tail(logs, 20))
		}
		if v := d.metricValue("poold_access_log_dropped_lines_total"); v < 1 {
			t.Fatalf("poold_access_log_dropped_lines_total = %v", v)
		}
		if !strings.Contains(logs, "recording engine") {
			t.Fatalf("want a warning about the state file; stderr:\n%s", tail(logs, 20))
		}
	})
}
