package enginesim

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
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

func TestSleepLevel1Cycle(t *testing.T) {
	const wake = 50 * time.Millisecond
	_, ts := newSleepServer(t, true, "--sim-wake-delay", wake.String())
	if isSleeping(t, ts.URL) {
		t.Fatal("asleep at start")
	}
	if resp, b := do(t, http.MethodPost, ts.URL+"/sleep?level=1", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /sleep: %d %s", resp.StatusCode, b)
	}
	if !isSleeping(t, ts.URL) {
		t.Fatal("not asleep after /sleep")
	}
	// Asleep: the API server still lists the model, but generation fails.
	if resp, _ := do(t, http.MethodGet, ts.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v1/models while asleep: %d", resp.StatusCode)
	}
	if resp, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", chatBody); resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "sleeping") {
		t.Errorf("chat while asleep: %d %s, want 500 naming the sleep", resp.StatusCode, b)
	}
	start := time.Now()
	if resp, b := do(t, http.MethodPost, ts.URL+"/wake_up", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /wake_up: %d %s", resp.StatusCode, b)
	}
	if took := time.Since(start); took < wake {
		t.Errorf("wake took %v, want at least --sim-wake-delay %v", took, wake)
	}
	if isSleeping(t, ts.URL) {
		t.Fatal("asleep after /wake_up")
	}
	if resp, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", chatBody); resp.StatusCode != http.StatusOK {
		t.Errorf("chat after wake: %d %s", resp.StatusCode, b)
	}
}

func TestSleepLevel2NeedsReload(t *testing.T) {
	_, ts := newSleepServer(t, true)
	do(t, http.MethodPost, ts.URL+"/sleep?level=2", "")
	do(t, http.MethodPost, ts.URL+"/wake_up", "")
	if resp, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", chatBody); resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "reload_weights") {
		t.Errorf("chat after a level-2 wake without reload: %d %s, want 500 naming reload_weights", resp.StatusCode, b)
	}
	if resp, b := do(t, http.MethodPost, ts.URL+"/collective_rpc", `{"method":"reload_weights"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("reload_weights: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, http.MethodPost, ts.URL+"/reset_prefix_cache", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("reset_prefix_cache: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", chatBody); resp.StatusCode != http.StatusOK {
		t.Errorf("chat after reload: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, http.MethodPost, ts.URL+"/sleep?level=3", ""); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("sleep level 3: %d, want 400", resp.StatusCode)
	}
}

func TestSleepRefuseWake(t *testing.T) {
	_, ts := newSleepServer(t, true, "--sim-refuse-wake")
	do(t, http.MethodPost, ts.URL+"/sleep", "")
	if resp, _ := do(t, http.MethodPost, ts.URL+"/wake_up", ""); resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("wake with --sim-refuse-wake: %d, want 500", resp.StatusCode)
	}
	if !isSleeping(t, ts.URL) {
		t.Error("awake after a refused wake")
	}
}

// TestSleepAbortsInFlight: /sleep with requests running aborts them, as
// vLLM's default sleep does, and counts them.
func TestSleepAbortsInFlight(t *testing.T) {
	s, ts := newSleepServer(t, true, "--sim-ttft", "1h")
	for _, stream := range []bool{false, true} {
		body := chatBody
		if stream {
			body = strings.Replace(body, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
		}
		type result struct {
			status int
			body   string
			err    error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				done <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			done <- result{resp.StatusCode, string(b), err}
		}()
		waitRunning(t, s, 1)
		before := s.SleepAborted()
		do(t, http.MethodPost, ts.URL+"/sleep?level=1", "")
		r := <-done
		if r.err != nil {
			t.Fatalf("stream %v: %v", stream, r.err)
		}
		if !strings.Contains(r.body, "aborted") || (!stream && r.status != http.StatusInternalServerError) {
			t.Errorf("stream %v: aborted request answered %d %q", stream, r.status, r.body)
		}
		if got := s.SleepAborted() - before; got != 1 {
			t.Errorf("stream %v: SleepAborted grew by %d, want 1", stream, got)
		}
		do(t, http.MethodPost, ts.URL+"/wake_up", "")
	}
	resp, b := do(t, http.MethodGet, ts.URL+"/metrics", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "sim_sleep_aborted_requests_total 2") {
		t.Errorf("metrics lack sim_sleep_aborted_requests_total 2:\n%s", b)
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
