package enginesim

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// newSleepServer serves m1 with sleep mode on and dev mode as given.
func newSleepServer(t *testing.T, dev bool, extra ...string) (*Server, *httptest.Server) {
	t.Helper()
	cfg, err := ParseFlags(append([]string{"/models/x", "--served-model-name", "m1", "--sim-tokens", "2", "--enable-sleep-mode"}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DevMode = dev
	s := NewHandler(cfg, nil)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	t.Cleanup(ts.CloseClientConnections) // first: ends requests left queued
	return s, ts
}

const chatBody = `{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`

func isSleeping(t *testing.T, url string) bool {
	t.Helper()
	resp, b := do(t, http.MethodGet, url+"/is_sleeping", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /is_sleeping: %d %s", resp.StatusCode, b)
	}
	return decode(t, b)["is_sleeping"].(bool)
}

// post sends a request and fails the test unless it gets want.
func post(t *testing.T, url, body string, want int) []byte {
	t.Helper()
	resp, b := do(t, http.MethodPost, url, body)
	if resp.StatusCode != want {
		t.Fatalf("POST %s: %d %s, want %d", url, resp.StatusCode, b, want)
	}
	return b
}

type result struct {
	status int
	body   string
	err    error
}

// send posts body to url in the background.
func send(url, body string) <-chan result {
	done := make(chan result, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, string(b), err}
	}()
	return done
}

// waitQueued waits until n requests wait in the engine's queue.
func waitQueued(t *testing.T, url string, n int) {
	t.Helper()
	want := series("vllm:num_requests_waiting") + " " + strconv.Itoa(n) + "\n"
	waitFor(t, 5*time.Second, want, func() bool {
		_, b := do(t, http.MethodGet, url+"/metrics", "")
		return strings.Contains(string(b), want)
	})
}

// stillQueued fails the test if the request has been answered.
func stillQueued(t *testing.T, r <-chan result, when string) {
	t.Helper()
	select {
	case res := <-r:
		t.Fatalf("%s: a queued request was answered: %d %s %v", when, res.status, res.body, res.err)
	default:
	}
}

func answered(t *testing.T, r <-chan result, what string) result {
	t.Helper()
	select {
	case res := <-r:
		if res.err != nil {
			t.Fatalf("%s: %v", what, res.err)
		}
		return res
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not answered", what)
		return result{}
	}
}

func TestSleepEndpointsNeedDevMode(t *testing.T) {
	_, ts := newSleepServer(t, false)
	for _, path := range []string{"/sleep?level=1", "/wake_up", "/collective_rpc", "/reset_prefix_cache"} {
		if resp, _ := do(t, http.MethodPost, ts.URL+path, `{}`); resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST %s without dev mode: %d, want 404", path, resp.StatusCode)
		}
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/is_sleeping", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /is_sleeping without dev mode: %d, want 404", resp.StatusCode)
	}
}

func TestSleepNeedsSleepMode(t *testing.T) {
	cfg, err := ParseFlags([]string{"--served-model-name", "m1"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.DevMode = true
	ts := httptest.NewServer(NewHandler(cfg, nil))
	defer ts.Close()
	if resp, b := do(t, http.MethodPost, ts.URL+"/sleep", ""); resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("POST /sleep without --enable-sleep-mode: %d %s, want 500", resp.StatusCode, b)
	}
}

// While asleep, the engine still lists its model, and a request queues
// (counted as waiting) until the engine wakes; then it is answered.
func TestSleepLevel1QueuesUntilWake(t *testing.T) {
	const wake = 50 * time.Millisecond
	_, ts := newSleepServer(t, true, "--sim-wake-delay", wake.String())
	if isSleeping(t, ts.URL) {
		t.Fatal("asleep at start")
	}
	post(t, ts.URL+"/sleep?level=1", "", http.StatusOK)
	if !isSleeping(t, ts.URL) {
		t.Fatal("not asleep after /sleep")
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v1/models while asleep: %d", resp.StatusCode)
	}
	r := send(ts.URL+"/v1/chat/completions", chatBody)
	waitQueued(t, ts.URL, 1)
	stillQueued(t, r, "asleep")
	start := time.Now()
	post(t, ts.URL+"/wake_up", "", http.StatusOK)
	if took := time.Since(start); took < wake {
		t.Errorf("wake took %v, want at least --sim-wake-delay %v", took, wake)
	}
	if isSleeping(t, ts.URL) {
		t.Fatal("asleep after /wake_up")
	}
	if res := answered(t, r, "queued chat"); res.status != http.StatusOK {
		t.Fatalf("queued chat after the wake: %d %s", res.status, res.body)
	}
	waitQueued(t, ts.URL, 0)
}

// A level-2 sleeper wakes in vLLM's documented order: weights, then
// reload_weights, then the KV cache; it serves only once all three are done.
func TestSleepLevel2WakeOrder(t *testing.T) {
	_, ts := newSleepServer(t, true)
	post(t, ts.URL+"/sleep?level=2", "", http.StatusOK)
	post(t, ts.URL+"/collective_rpc", `{"method":"reload_weights"}`, http.StatusInternalServerError) // the weights are asleep
	r := send(ts.URL+"/v1/chat/completions", chatBody)
	waitQueued(t, ts.URL, 1)

	post(t, ts.URL+"/wake_up?tags=weights", "", http.StatusOK)
	if !isSleeping(t, ts.URL) {
		t.Fatal("not sleeping with the KV cache asleep")
	}
	post(t, ts.URL+"/collective_rpc", `{"method":"reload_weights"}`, http.StatusOK)
	post(t, ts.URL+"/reset_prefix_cache", "", http.StatusOK)
	stillQueued(t, r, "weights reloaded, KV cache asleep")
	post(t, ts.URL+"/wake_up?tags=kv_cache", "", http.StatusOK)
	if isSleeping(t, ts.URL) {
		t.Fatal("sleeping after waking both tags")
	}
	if res := answered(t, r, "queued chat"); res.status != http.StatusOK {
		t.Fatalf("queued chat: %d %s", res.status, res.body)
	}

	// /wake_up without tags wakes all; the weights still need reloading.
	post(t, ts.URL+"/sleep?level=2", "", http.StatusOK)
	post(t, ts.URL+"/wake_up", "", http.StatusOK)
	if isSleeping(t, ts.URL) {
		t.Fatal("sleeping after /wake_up")
	}
	r = send(ts.URL+"/v1/chat/completions", chatBody)
	waitQueued(t, ts.URL, 1)
	stillQueued(t, r, "woken without reload_weights")
	post(t, ts.URL+"/collective_rpc", `{"method":"reload_weights"}`, http.StatusOK)
	if res := answered(t, r, "queued chat"); res.status != http.StatusOK {
		t.Fatalf("queued chat after the reload: %d %s", res.status, res.body)
	}

	// A level-1 sleeper needs no reload.
	post(t, ts.URL+"/sleep", "", http.StatusOK)
	post(t, ts.URL+"/wake_up", "", http.StatusOK)
	post(t, ts.URL+"/v1/chat/completions", chatBody, http.StatusOK)
}

func TestSleepBadParameters(t *testing.T) {
	_, ts := newSleepServer(t, true)
	for _, path := range []string{"/sleep?level=3", "/sleep?level=x", "/sleep?mode=drop", "/wake_up?tags=everything"} {
		post(t, ts.URL+path, "", http.StatusBadRequest)
	}
	post(t, ts.URL+"/collective_rpc", `{"method":"format_disk"}`, http.StatusBadRequest)
}

func TestSleepRefuseWake(t *testing.T) {
	_, ts := newSleepServer(t, true, "--sim-refuse-wake")
	post(t, ts.URL+"/sleep", "", http.StatusOK)
	post(t, ts.URL+"/wake_up", "", http.StatusInternalServerError)
	if !isSleeping(t, ts.URL) {
		t.Error("awake after a refused wake")
	}
}

// /sleep (mode abort, the default) with requests running aborts them, as
// vLLM does: they finish with finish_reason "abort" (a non-streaming one with
// 200, a stream with a last chunk, its usage and [DONE]); they are counted.
func TestSleepAbortsInFlight(t *testing.T) {
	s, ts := newSleepServer(t, true, "--sim-ttft", "1h")
	for _, stream := range []bool{false, true} {
		body := chatBody
		if stream {
			body = `{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{}}`
		}
		r := send(ts.URL+"/v1/chat/completions", body)
		waitRunning(t, s, 1)
		before := s.SleepAborted()
		post(t, ts.URL+"/sleep?level=1&mode=abort", "", http.StatusOK)
		res := answered(t, r, "aborted request")
		if res.status != http.StatusOK || !strings.Contains(res.body, `"finish_reason":"abort"`) {
			t.Errorf("stream %v: aborted request answered %d %q", stream, res.status, res.body)
		}
		if stream && (!strings.Contains(res.body, `"choices":[],"usage":{"prompt_tokens":1,"total_tokens":1,"completion_tokens":0}`) ||
			!strings.HasSuffix(res.body, "data: [DONE]\n\n")) {
			t.Errorf("aborted stream lacks its usage or [DONE]: %q", res.body)
		}
		if got := s.SleepAborted() - before; got != 1 {
			t.Errorf("stream %v: SleepAborted grew by %d, want 1", stream, got)
		}
		post(t, ts.URL+"/wake_up", "", http.StatusOK)
	}
	resp, b := do(t, http.MethodGet, ts.URL+"/metrics", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "sim_sleep_aborted_requests_total 2") {
		t.Errorf("metrics lack sim_sleep_aborted_requests_total 2:\n%s", b)
	}
}

// /sleep?mode=wait lets the requests in flight finish, and queues the new
// ones, before it sleeps: none is aborted.
func TestSleepModeWait(t *testing.T) {
	s, ts := newSleepServer(t, true, "--sim-itl", "20ms")
	inflight := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":20}`)
	waitRunning(t, s, 1)
	slept := send(ts.URL+"/sleep?level=1&mode=wait", "")
	waitFor(t, 5*time.Second, "the sleep to pause the engine", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.sleep.pausing
	})
	late := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":1}`)
	waitQueued(t, ts.URL, 1)
	res := answered(t, slept, "/sleep?mode=wait")
	if res.status != http.StatusOK {
		t.Fatalf("sleep: %d %s", res.status, res.body)
	}
	if res := answered(t, inflight, "request in flight"); res.status != http.StatusOK ||
		!strings.Contains(res.body, `"finish_reason":"length"`) || !strings.Contains(res.body, "tok19 ") {
		t.Fatalf("request in flight: %d %s", res.status, res.body)
	}
	stillQueued(t, late, "asleep")
	if s.SleepAborted() != 0 {
		t.Fatalf("mode=wait aborted %d requests", s.SleepAborted())
	}
	post(t, ts.URL+"/wake_up", "", http.StatusOK)
	if res := answered(t, late, "queued request"); res.status != http.StatusOK {
		t.Fatalf("queued request: %d %s", res.status, res.body)
	}
}

// vllm:engine_sleep_state reports the sleep level, as vLLM's does.
func TestSleepStateMetric(t *testing.T) {
	_, ts := newSleepServer(t, true)
	for _, step := range []struct{ path, want string }{
		{"", "awake=1 weights_offloaded=0 discard_all=0"},
		{"/sleep?level=2", "awake=0 weights_offloaded=0 discard_all=1"},
		{"/wake_up", "awake=1 weights_offloaded=0 discard_all=0"},
		{"/sleep?level=1", "awake=0 weights_offloaded=1 discard_all=0"},
	} {
		if step.path != "" {
			post(t, ts.URL+step.path, "", http.StatusOK)
		}
		if got := sleepStateMetric(t, ts.URL); got != step.want {
			t.Errorf("after %q: %s, want %s", step.path, got, step.want)
		}
	}
}

// waitRunning polls until n requests are registered as generating.
func waitRunning(t *testing.T, s *Server, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		s.mu.Lock()
		got := len(s.sleep.requests)
		s.mu.Unlock()
		if got == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d requests running, want %d", got, n)
		case <-time.After(time.Millisecond):
		}
	}
}

// sleepStateMetric reads vllm:engine_sleep_state as "awake=1
// weights_offloaded=0 discard_all=0".
func sleepStateMetric(t *testing.T, url string) string {
	t.Helper()
	_, b := do(t, http.MethodGet, url+"/metrics", "")
	var out []string
	for _, st := range []string{"awake", "weights_offloaded", "discard_all"} {
		prefix := `vllm:engine_sleep_state{engine="0",model_name="m1",sleep_state="` + st + `"} `
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				out = append(out, st+"="+v)
			}
		}
	}
	return strings.Join(out, " ")
}

// With --sim-idle-sleep the engine sleeps by itself once idle, at the
// level asked, as vllm:engine_sleep_state and /is_sleeping tell; the next
// request wakes it and is answered, and the engine sleeps again once idle.
// (Its awake state between the two is too short to read reliably.)
func TestIdleSleep(t *testing.T) {
	for _, tc := range []struct {
		level, asleep string
	}{
		{"1", "awake=0 weights_offloaded=1 discard_all=0"},
		{"2", "awake=0 weights_offloaded=0 discard_all=1"},
	} {
		_, ts := newSleepServer(t, true, "--sim-idle-sleep", "30ms", "--sim-idle-sleep-level", tc.level)
		for round := range 2 {
			waitFor(t, 5*time.Second, "the engine to sleep idle", func() bool { return isSleeping(t, ts.URL) })
			if got := sleepStateMetric(t, ts.URL); got != tc.asleep {
				t.Fatalf("level %s, round %d: asleep %s, want %s", tc.level, round, got, tc.asleep)
			}
			// Answered only once the engine serves again: the request woke it.
			if b := post(t, ts.URL+"/v1/chat/completions", chatBody, http.StatusOK); !strings.Contains(string(b), `"finish_reason":"length"`) {
				t.Fatalf("level %s, round %d: request after idle sleep: %s", tc.level, round, b)
			}
		}
	}
}

// An engine put to sleep by a caller does not wake for a request, idle
// sleep or not; after its wake it sleeps idle again.
func TestIdleSleepAfterCallerSleep(t *testing.T) {
	_, ts := newSleepServer(t, true, "--sim-idle-sleep", "30ms")
	waitFor(t, 5*time.Second, "the engine to sleep idle", func() bool { return isSleeping(t, ts.URL) })
	post(t, ts.URL+"/wake_up", "", http.StatusOK)
	post(t, ts.URL+"/sleep?level=1", "", http.StatusOK)
	r := send(ts.URL+"/v1/chat/completions", chatBody)
	waitQueued(t, ts.URL, 1)
	stillQueued(t, r, "asleep by a caller")
	post(t, ts.URL+"/wake_up", "", http.StatusOK)
	if res := answered(t, r, "queued request"); res.status != http.StatusOK {
		t.Fatalf("queued request: %d %s", res.status, res.body)
	}
	waitFor(t, 5*time.Second, "the engine to sleep idle again", func() bool { return isSleeping(t, ts.URL) })
}

func TestIdleSleepFlags(t *testing.T) {
	for _, args := range [][]string{
		{"m", "--sim-idle-sleep", "1s"},
		{"m", "--enable-sleep-mode", "--sim-idle-sleep", "1s", "--sim-idle-sleep-level", "3"},
	} {
		if _, err := ParseFlags(args); err == nil {
			t.Errorf("%v: parsed", args)
		}
	}
}

// /sleep?mode=keep keeps the request in flight, paused: it makes no token
// while the engine sleeps, and goes on to its end after the wake.
func TestSleepModeKeep(t *testing.T) {
	s, ts := newSleepServer(t, true, "--sim-itl", "20ms")
	inflight := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":20}`)
	waitRunning(t, s, 1)
	post(t, ts.URL+"/sleep?level=1&mode=keep", "", http.StatusOK)
	stillQueued(t, inflight, "asleep with mode=keep")
	waitRunning(t, s, 1) // kept, not aborted
	post(t, ts.URL+"/wake_up", "", http.StatusOK)
	res := answered(t, inflight, "kept request")
	if res.status != http.StatusOK || !strings.Contains(res.body, `"finish_reason":"length"`) || !strings.Contains(res.body, "tok19 ") {
		t.Fatalf("kept request: %d %s", res.status, res.body)
	}
	if s.SleepAborted() != 0 {
		t.Fatalf("mode=keep aborted %d requests", s.SleepAborted())
	}
}
