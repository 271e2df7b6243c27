package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// chatBody is a chat request for model.
func chatBody(model string, stream bool, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":"say something nice"}]}`, model, stream, maxTokens)
}

// checkStream asserts that body is a complete, intact simulator chat stream of
// n tokens, with no usage chunk, and returns its content.
func checkStream(t *testing.T, body []byte, model string, n int) {
	t.Helper()
	events := sseEvents(body)
	if len(events) != n+2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream has %d events (want %d, ending in [DONE]):\n%s", len(events), n+2, body)
	}
	var content strings.Builder
	for i, ev := range events[:len(events)-1] {
		var chunk struct {
			Model   string `json:"model"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
			t.Fatalf("event %d is not JSON: %v: %s", i, err, ev)
		}
		if chunk.Model != model || len(chunk.Choices) != 1 || chunk.Usage != nil {
			t.Fatalf("event %d: unexpected chunk %s", i, ev)
		}
		content.WriteString(chunk.Choices[0].Delta.Content)
	}
	var want strings.Builder
	for i := range n {
		fmt.Fprintf(&want, "tok%d ", i)
	}
	if content.String() != want.String() {
		t.Fatalf("stream content %q, want %q", content.String(), want.String())
	}
}

func TestAliasResolvesToCanonicalID(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "qwen"}},
		[]sim{{ID: "qwen", Aliases: []string{"chat", "qwen-7b"}}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	code, hdr, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("chat", false, 4))
	if err != nil || code != http.StatusOK {
		t.Fatalf("chat via alias: %d %v %s", code, err, body)
	}
	var resp struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(body, &resp); err != nil || resp.Model != "qwen" {
		t.Fatalf("upstream did not see the canonical id: model %q (%v)", resp.Model, err)
	}
	// The access log line names both the name asked for and the profile.
	id := hdr.Get("X-Request-Id")
	line := waitLogLine(t, d, id)
	if line["model"] != "chat" || line["profile"] != "qwen" || line["pool"] != "p0" || line["completion_tokens"] != 4.0 {
		t.Fatalf("access log line: %v", line)
	}
	// /v1/models lists every name with its state.
	resp2, err := http.Get(d.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	var list struct {
		Data []struct {
			ID, Root, State string
		}
	}
	if err := json.NewDecoder(resp2.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range list.Data {
		got[m.ID] = m.Root + "/" + m.State
	}
	want := map[string]string{"chat": "qwen/ready", "qwen": "qwen/ready", "qwen-7b": "qwen/ready"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("/v1/models = %v, want %v", got, want)
	}
}

// waitLogLine returns the access-log line of request id.
func waitLogLine(t *testing.T, d *daemon, id string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, l := range strings.Split(d.stdout.String(), "\n") {
			if !strings.Contains(l, `"request_id":"`+id+`"`) {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("access log line is not JSON: %v: %s", err, l)
			}
			return m
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no access log line for request %q in:\n%s", id, d.stdout.String())
	return nil
}

// A request for B on a pool serving A waits while an A stream is in flight; the
// A stream completes intact, and only then is A stopped (under the stop
// contract: it ignores SIGTERM, so it is killed after stopTimeout along with its
// child) and B started and served. /status shows each phase.
func TestSwapWaitsForInFlightStream(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{
			{ID: "a", Flags: []string{"--sim-itl", "40ms", "--sim-ignore-sigterm", "--sim-spawn-child"}, Extra: map[string]any{"stopTimeout": "1s"}},
			{ID: "b", Flags: []string{"--sim-load-delay", "1s"}},
		}, nil))
	ready := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	pgidA := ready.Engine.PID

	type result struct {
		code int
		body []byte
		err  error
		at   time.Time
	}
	aDone := make(chan result, 1)
	go func() {
		code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("a", true, 40))
		aDone <- result{code, body, err, time.Now()}
	}()
	d.waitPool("p0", 10*time.Second, "a in flight", func(p poolView) bool { return p.InFlight == 1 })

	bDone := make(chan result, 1)
	go func() {
		code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("b", false, 3))
		bDone <- result{code, body, err, time.Now()}
	}()
	// Draining: a still loaded with its stream in flight, b waiting, gate closed.
	d.waitPool("p0", 10*time.Second, "draining", func(p poolView) bool {
		return p.State == "draining" && p.Profile == "a" && p.InFlight == 1 && p.Waiting["b"] == 1 && p.Gate == "closed"
	})
	if len(groupAlive(pgidA)) < 2 {
		t.Fatalf("engine a and its child should be alive while draining: %v", groupAlive(pgidA))
	}
	// Stopping: the a stream is over, a ignores SIGTERM for its stopTimeout.
	d.waitPool("p0", 10*time.Second, "stopping", func(p poolView) bool { return p.State == "stopping" && p.SwitchingTo == "b" })
	a := <-aDone
	if a.err != nil || a.code != http.StatusOK {
		t.Fatalf("a stream: %d %v", a.code, a.err)
	}
	checkStream(t, a.body, "a", 40)
	// Starting: b loads for a second.
	d.waitPool("p0", 10*time.Second, "starting", func(p poolView) bool { return p.State == "starting" && p.SwitchingTo == "b" })
	if left := groupAlive(pgidA); len(left) > 0 {
		t.Fatalf("engine a's process group survived the stop: %v", left)
	}
	b := <-bDone
	if b.err != nil || b.code != http.StatusOK {
		t.Fatalf("b: %d %v %s", b.code, b.err, b.body)
	}
	if !b.at.After(a.at) {
		t.Fatalf("b was answered before the a stream ended")
	}
	// The lease is released just after the body's last byte is sent.
	d.waitPool("p0", 5*time.Second, "b ready, idle", func(p poolView) bool {
		return p.State == "ready" && p.Profile == "b" && p.InFlight == 0 && p.LastError == ""
	})
}

// TestOpenAIClient is in openai_test.go.

func TestLoadFailureAnswersWaiters(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}},
		[]sim{{ID: "broken", Flags: []string{"--sim-load-delay", "300ms", "--sim-fail-load"}}}, nil))
	start := time.Now()
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("broken", false, 3))
	if err != nil {
		t.Fatal(err)
	}
	// The failure happens at ~300 ms; the answer must follow within a second.
	if took := time.Since(start); took > 1300*time.Millisecond {
		t.Errorf("waiting request answered %s after it was sent", took)
	}
	var e apiErr
	if code != http.StatusBadGateway || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error.Message, "simulated load failure") {
		t.Fatalf("got %d %s; want 502 naming the cause", code, body)
	}
	p := d.pool("p0")
	if p.State != "failed" || !strings.Contains(p.LastError, "simulated load failure") {
		t.Fatalf("/status after a failed load: %+v", p)
	}
}

// apiErr is the OpenAI error body.
type apiErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	} `json:"error"`
}

func TestNeverReadyFailsAtStartupTimeout(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}},
		[]sim{{ID: "stuck", Flags: []string{"--sim-never-ready"}, Extra: map[string]any{"startupTimeout": "1s"}}}, nil))
	start := time.Now()
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("stuck", false, 3))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if code != http.StatusBadGateway || !strings.Contains(string(body), "not ready after startupTimeout 1s") {
		t.Fatalf("got %d %s", code, body)
	}
	if took < time.Second {
		t.Fatalf("failed after %s, before the startupTimeout", took)
	}
	d.waitPool("p0", 5*time.Second, "failed", func(p poolView) bool {
		return p.State == "failed" && strings.Contains(p.LastError, "startupTimeout")
	})
}

func TestCrashMidStreamEndsStreamAndRestarts(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "fragile"}},
		[]sim{{ID: "fragile", Flags: []string{"--sim-crash-after-tokens", "5", "--sim-itl", "5ms"}}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("fragile", true, 20))
	if code != http.StatusOK {
		t.Fatalf("stream status %d", code)
	}
	// The stream is cut: either the connection aborts (err) or the body ends
	// with poold's error event; never a [DONE].
	if strings.Contains(string(body), "[DONE]") {
		t.Fatalf("a crashed stream ended normally:\n%s", body)
	}
	if err == nil && !strings.Contains(string(body), `"engine_stream_failed"`) {
		t.Fatalf("stream ended without error:\n%s", body)
	}
	d.waitPool("p0", 5*time.Second, "lease freed and failure shown", func(p poolView) bool {
		return p.InFlight == 0 && p.State == "failed" && p.LastError != ""
	})
	// The next request restarts the engine (3 tokens stay under the crash point).
	code, _, body, err = d.post(context.Background(), "/v1/chat/completions", chatBody("fragile", false, 3))
	if err != nil || code != http.StatusOK {
		t.Fatalf("request after the crash: %d %v %s", code, err, body)
	}
	d.waitPool("p0", 5*time.Second, "ready again", func(p poolView) bool { return p.State == "ready" && p.LastError == "" })
}

func TestBadRequests(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}},
		[]sim{{ID: "m", Aliases: []string{"alias-m"}}}, nil), "--max-body-bytes", "1024")
	cases := []struct {
		name, body string
		code       int
		param      string
		contains   string
	}{
		{"malformed", `{"model": "m", `, 400, "", "invalid request body"},
		{"empty", ``, 400, "", "empty"},
		{"missing model", `{"messages": []}`, 400, "model", `"model" is required`},
		{"model not a string", `{"model": 5}`, 400, "model", `"model" must be a string`},
		{"stream not a bool", `{"model": "m", "stream": "yes"}`, 400, "stream", `"stream" must be a boolean`},
		{"unknown model", `{"model": "nope"}`, 404, "model", `available models: alias-m, m`},
		{"too large", `{"model": "m", "x": "` + strings.Repeat("a", 2000) + `"}`, 413, "", "1024 byte limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, hdr, body, err := d.post(context.Background(), "/v1/chat/completions", c.body)
			if err != nil {
				t.Fatal(err)
			}
			var e apiErr
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body is not an OpenAI error: %s", body)
			}
			if code != c.code || !strings.Contains(e.Error.Message, c.contains) || e.Error.Type == "" || e.Error.Code == nil {
				t.Fatalf("got %d %s; want %d containing %q", code, body, c.code, c.contains)
			}
			if (e.Error.Param == nil) != (c.param == "") || (e.Error.Param != nil && *e.Error.Param != c.param) {
				t.Fatalf("param %v, want %q", e.Error.Param, c.param)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
		})
	}
	// None of this started an engine, and the daemon still serves.
	if p := d.pool("p0"); p.State != "empty" {
		t.Fatalf("bad requests touched the pool: %+v", p)
	}
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("alias-m", false, 2))
	if err != nil || code != 200 {
		t.Fatalf("good request after bad ones: %d %v %s", code, err, body)
	}
}

func TestClientDisconnectReleasesLease(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "50ms"}}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("m", true, 1000)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	if p := d.pool("p0"); p.InFlight != 1 {
		t.Fatalf("in flight %d during the stream", p.InFlight)
	}
	cancel()
	resp.Body.Close()
	d.waitPool("p0", 2*time.Second, "lease released", func(p poolView) bool { return p.InFlight == 0 })
}

// A queued request whose client disconnects leaves the queue at once.
func TestQueuedClientDisconnectLeavesQueue(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}},
		[]sim{{ID: "slow", Flags: []string{"--sim-load-delay", "20s"}}}, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _, _ = d.post(ctx, "/v1/chat/completions", chatBody("slow", false, 1))
	}()
	d.waitPool("p0", 5*time.Second, "waiting", func(p poolView) bool { return p.Waiting["slow"] == 1 })
	cancel()
	<-done
	d.waitPool("p0", 2*time.Second, "queue empty", func(p poolView) bool { return len(p.Waiting) == 0 })
}

func TestBadProfilesFileExitsWithEveryError(t *testing.T) {
	bad := []byte(`{"pools":[{"name":"a","gpus":[0]},{"name":"b","gpus":[0]}],
	  "profiles":[{"id":"x","model":"m","pools":["nope"]},{"id":"x","model":"m","startupTimeout":"soon"}]}`)
	d := launch(t, t.Name(), bad)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("poold did not exit on a bad profiles file")
	}
	var exit *exec.ExitError
	if !asExit(d.err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("exit: %v, want non-zero", d.err)
	}
	out := d.stderr.String()
	for _, want := range []string{
		"\n" + `pools[1] "b": gpus[0]: GPU 0 is already in pool "a"` + "\n",
		"\n" + `profiles[0] "x": pools[0] "nope": no such pool` + "\n",
		"\n" + `profiles[1] "x": id "x": name already used by profiles[0] "x"` + "\n",
		"\n" + `profiles[1] "x": startupTimeout: invalid duration "soon"` + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %s:\n%s", want, out)
		}
	}
}

func asExit(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*target = e
	return ok
}

// SIGTERM with a stream in flight: the stream completes, the engines stop,
// poold exits 0 and leaves no process behind (checked at cleanup).
func TestGracefulShutdownCompletesStream(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "30ms", "--sim-spawn-child"}}}, nil))
	ready := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	type result struct {
		code int
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("m", true, 30))
		done <- result{code, body, err}
	}()
	d.waitPool("p0", 5*time.Second, "in flight", func(p poolView) bool { return p.InFlight == 1 })
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.code != 200 {
		t.Fatalf("stream during shutdown: %d %v", r.code, r.err)
	}
	checkStream(t, r.body, "m", 30)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("poold did not exit after SIGTERM")
	}
	if d.err != nil {
		t.Fatalf("poold exit: %v\n%s", d.err, tail(d.stderr.String(), 20))
	}
	if left := groupAlive(ready.Engine.PID); len(left) > 0 {
		t.Fatalf("engine group survived shutdown: %v", left)
	}
}
