package enginesim

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// While the server drains (--shutdown-timeout), new requests and /health
// get 503 and /metrics answers; the request in flight runs to its end, and
// the drain ends with it.
func TestShutdownDrainsInFlight(t *testing.T) {
	s, ts := newTestServer(t, "--sim-itl", "20ms", "--max-model-len", "1000")
	inflight := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":30}`)
	waitRunning(t, s, 1)
	drained := make(chan struct{})
	go func() { s.shutdown(time.Minute); close(drained) }()
	waitFor(t, 5*time.Second, "the server to refuse new requests", s.rejecting)
	for _, p := range []string{"/v1/completions", "/health"} {
		method := http.MethodPost
		if p == "/health" {
			method = http.MethodGet
		}
		resp, b := do(t, method, ts.URL+p, `{"model":"m1","prompt":"x","max_tokens":1}`)
		if resp.StatusCode != http.StatusServiceUnavailable || string(b) != string(unavailable) {
			t.Errorf("%s while draining: %d %s", p, resp.StatusCode, b)
		}
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/metrics", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics while draining: %d", resp.StatusCode)
	}
	res := answered(t, inflight, "request in flight")
	if res.status != http.StatusOK || !strings.Contains(res.body, `"finish_reason":"length"`) || !strings.Contains(res.body, "tok29 ") {
		t.Fatalf("request in flight: %d %s", res.status, res.body)
	}
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("the drain did not end with the last request")
	}
}

// When --shutdown-timeout runs out, the requests still generating end with
// what they made and finish_reason "abort", streamed or not.
func TestShutdownTimeoutAborts(t *testing.T) {
	s, ts := newTestServer(t, "--sim-ttft", "1h")
	plain := send(ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
	stream := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","stream":true,"stream_options":{}}`)
	waitRunning(t, s, 2)
	s.shutdown(50 * time.Millisecond)
	if res := answered(t, plain, "plain request"); res.status != http.StatusOK || !strings.Contains(res.body, `"finish_reason":"abort"`) {
		t.Errorf("plain request: %d %s", res.status, res.body)
	}
	res := answered(t, stream, "stream")
	if res.status != http.StatusOK || !strings.Contains(res.body, `"finish_reason":"abort"`) || !strings.HasSuffix(res.body, "data: [DONE]\n\n") {
		t.Errorf("stream: %d %q", res.status, res.body)
	}
}

// Under SIGTERM with --shutdown-timeout, the process lets a stream in
// flight finish, then exits 0.
func TestProcessShutdownTimeoutLetsStreamsFinish(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-itl", "20ms", "--shutdown-timeout", "60")
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", p.port(t))
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","prompt":"x","max_tokens":40,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(b), "tok39") || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("stream after SIGTERM: %v, %q", err, b)
	}
	if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 0 {
		t.Fatalf("status %v, want exit 0", st)
	}
}
