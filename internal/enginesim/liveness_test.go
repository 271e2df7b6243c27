package enginesim

import (
	"bufio"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A dead engine core: /health and /ping answer 503, requests that need the
// engine 500, requests in flight end with vLLM's EngineDeadError, and
// /v1/models still answers (the API server alone serves it).
func TestCoreDeath(t *testing.T) {
	s, ts := newTestServer(t, "--sim-itl", "1h", "--max-model-len", "1000")
	stream := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":5,"stream":true}`)
	plain := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":5}`)
	waitRunning(t, s, 2)
	s.killCore()
	res := answered(t, stream, "stream in flight")
	if res.status != http.StatusOK || !strings.Contains(res.body, `data: {"error":{"message":"EngineCore encountered an issue.`) ||
		!strings.HasSuffix(res.body, "data: [DONE]\n\n") {
		t.Fatalf("stream in flight: %d %q", res.status, res.body)
	}
	if res := answered(t, plain, "request in flight"); res.status != http.StatusInternalServerError || !strings.Contains(res.body, "EngineCore") {
		t.Fatalf("request in flight: %d %s", res.status, res.body)
	}
	for _, p := range []string{"/health", "/ping"} {
		if resp, _ := do(t, http.MethodGet, ts.URL+p, ""); resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s: %d, want 503", p, resp.StatusCode)
		}
	}
	post(t, ts.URL+"/v1/chat/completions", chatBody, http.StatusInternalServerError)
	if resp, _ := do(t, http.MethodGet, ts.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("/v1/models: %d, want 200", resp.StatusCode)
	}
	select {
	case <-s.deadHit:
	default:
		t.Error("requests met the dead core, and Run was not told")
	}
}

// The watchdog ends the server once the core is dead, unless
// VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set.
func TestProcessCoreDeath(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-core-dies-after", "100ms", "--sim-watchdog-interval", "50ms")
	p.port(t)
	if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 1 || !strings.Contains(p.log(), ErrEngineDead.Error()) {
		t.Fatalf("%v, want exit 1 after the engine's death:\n%s", st, p.log())
	}

	p = startSimEnv(t, []string{"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1"}, "m", "--port", "0", "--sim-core-dies-after", "100ms", "--sim-watchdog-interval", "50ms")
	url := fmt.Sprintf("http://127.0.0.1:%d", p.port(t))
	p.waitLog(t, "staying up (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)")
	post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, http.StatusInternalServerError)
	if resp, _ := do(t, http.MethodGet, url+"/health", ""); resp.StatusCode != http.StatusServiceUnavailable || p.exited() {
		t.Fatalf("health %d, exited %v", resp.StatusCode, p.exited())
	}
}

// --sim-die-on-first-request: the engine becomes ready (/v1/models and
// /health answer), its first inference request gets vLLM's 500 after the
// engine core printed its reason, and the server exits 1 at its watchdog,
// not at once: the 500 is answered whole.
func TestProcessDieOnFirstRequest(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-die-on-first-request", "--sim-watchdog-interval", "200ms")
	url := fmt.Sprintf("http://127.0.0.1:%d", p.port(t))
	for _, path := range []string{"/v1/models", "/health"} {
		if resp, b := do(t, http.MethodGet, url+path, ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s before the first request: %d %s", path, resp.StatusCode, b)
		}
	}
	b := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, http.StatusInternalServerError)
	const want = `{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","param":null,"code":500}}`
	if string(b) != want {
		t.Fatalf("first request: %s\nwant %s", b, want)
	}
	if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 1 {
		t.Fatalf("%v, want exit 1 after the engine core's death", st)
	}
	out := p.log()
	reason := strings.Index(out, "] RuntimeError: Unsupported CPU attention configuration: head_dim=16")
	dead := strings.Index(out, "EngineDeadError: EngineCore encountered an issue.")
	exit := strings.Index(out, ErrEngineDead.Error())
	if reason < 0 || dead < reason || exit < dead {
		t.Fatalf("want the core's reason, then the API server's EngineDeadError, then the exit:\n%s", out)
	}
}

// --sim-die-on-first-request, served: the first inference request and
// those beside it get vLLM's 500, the reason is printed once, /health then
// answers 503 and /v1/models still answers.
func TestDieOnFirstRequest(t *testing.T) {
	cfg, err := ParseFlags([]string{"/models/x", "--served-model-name", "m1", "--sim-die-on-first-request"})
	if err != nil {
		t.Fatal(err)
	}
	s := NewHandler(cfg, nil)
	var out syncBuffer
	s.out = &out
	ts := httptest.NewServer(s)
	defer ts.Close()
	if resp, _ := do(t, http.MethodGet, ts.URL+"/health", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("/health before the first request: %d", resp.StatusCode)
	}
	first := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":5}`)
	beside := send(ts.URL+"/v1/chat/completions", chatBody)
	for what, r := range map[string]<-chan result{"the first request": first, "the request beside it": beside} {
		if res := answered(t, r, what); res.status != http.StatusInternalServerError || !strings.Contains(res.body, `"message":"EngineCore encountered an issue.`) {
			t.Fatalf("%s: %d %s", what, res.status, res.body)
		}
	}
	post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"x"}`, http.StatusInternalServerError)
	if resp, _ := do(t, http.MethodGet, ts.URL+"/health", ""); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/health after: %d, want 503", resp.StatusCode)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("/v1/models after: %d, want 200", resp.StatusCode)
	}
	if n := strings.Count(out.String(), "] "+firstRequestReason+"\n"); n != 1 {
		t.Fatalf("the reason printed %d times, want once:\n%s", n, out.String())
	}
}

// With VLLM_API_KEY, every /v1 request must bear it, as vLLM's middleware
// asks; other paths need none.
func TestAPIKey(t *testing.T) {
	cfg, err := ParseFlags([]string{"/models/x", "--served-model-name", "m1"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.APIKey = "sk-engine"
	ts := httptest.NewServer(NewHandler(cfg, nil))
	defer ts.Close()
	for _, tc := range []struct {
		method, path, auth string
		status             int
	}{
		{"GET", "/v1/models", "", http.StatusUnauthorized},
		{"GET", "/v1/models", "Bearer wrong", http.StatusUnauthorized},
		{"GET", "/v1/models", "Basic sk-engine", http.StatusUnauthorized},
		{"GET", "/v1/models", "Bearer sk-engine", http.StatusOK},
		{"GET", "/v1/models", "bearer sk-engine", http.StatusOK},
		{"POST", "/v1/chat/completions", "", http.StatusUnauthorized},
		{"POST", "/v1/nope", "", http.StatusUnauthorized},
		{"GET", "/health", "", http.StatusOK},
		{"GET", "/metrics", "", http.StatusOK},
		{"POST", "/tokenize", "", http.StatusOK},
	} {
		header := map[string]string{}
		if tc.auth != "" {
			header["Authorization"] = tc.auth
		}
		resp, b := doHeader(t, tc.method, ts.URL+tc.path, `{"prompt":"x"}`, header)
		if resp.StatusCode != tc.status || (tc.status == http.StatusUnauthorized && string(b) != `{"error":"Unauthorized"}`) {
			t.Errorf("%s %s %q: %d %s, want %d", tc.method, tc.path, tc.auth, resp.StatusCode, b, tc.status)
		}
	}
}

// The incoming X-Request-Id is the request id: in the response's id and
// --enable-log-requests' line; --enable-request-id-headers returns it.
func TestRequestID(t *testing.T) {
	for _, headers := range []bool{false, true} {
		args := []string{"/models/x", "--served-model-name", "m1", "--enable-log-requests"}
		if headers {
			args = append(args, "--enable-request-id-headers")
		}
		cfg, err := ParseFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		var logs syncBuffer
		ts := httptest.NewServer(NewHandler(cfg, slog.New(slog.NewTextHandler(&logs, nil))))
		for path, prefix := range map[string]string{"/v1/chat/completions": "chatcmpl-", "/v1/completions": "cmpl-"} {
			resp, b := doHeader(t, "POST", ts.URL+path, `{"prompt":"x","messages":[],"max_tokens":1}`, map[string]string{"X-Request-Id": "req-42"})
			if id := decode(t, b)["id"]; id != prefix+"req-42" {
				t.Errorf("%s: id %v, want %sreq-42", path, id, prefix)
			}
			if got := resp.Header.Get("X-Request-Id"); (got == "req-42") != headers {
				t.Errorf("headers %v, %s: X-Request-Id %q", headers, path, got)
			}
		}
		for _, id := range []string{"chatcmpl-req-42", "cmpl-req-42"} {
			if !strings.Contains(logs.String(), `msg="Received request `+id+`"`) {
				t.Errorf("log lacks request %s:\n%s", id, logs.String())
			}
		}
		resp, _ := do(t, http.MethodGet, ts.URL+"/health", "")
		if got := resp.Header.Get("X-Request-Id"); headers != (len(got) == 32) {
			t.Errorf("headers %v: generated X-Request-Id %q", headers, got)
		}
		ts.Close()
	}
}

// --enable-log-requests logs every prompt whole, on one line, however long
// and whatever it holds.
func TestLogRequests(t *testing.T) {
	cfg, err := ParseFlags([]string{"/models/x", "--served-model-name", "m1", "--enable-log-requests", "--max-model-len", "100000"})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	ts := httptest.NewServer(NewHandler(cfg, slog.New(slog.NewTextHandler(&logs, nil))))
	defer ts.Close()
	prompt := strings.Repeat("word ", 16000) + "line\nbreak"
	body := fmt.Sprintf(`{"model":"m1","prompt":%q,"max_tokens":1}`, prompt)
	post(t, ts.URL+"/v1/completions", body, http.StatusOK)
	var lines []string
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, "Received request cmpl-") {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], strings.Repeat("word ", 16000)+`line\nbreak`) {
		t.Fatalf("%d request lines, want 1 with the whole prompt (%d bytes logged)", len(lines), len(logs.String()))
	}
	if _, err := ParseFlags([]string{"--disable-log-requests"}); err == nil {
		t.Error("--disable-log-requests, gone from vLLM, was accepted")
	}
}

// The engine ignores SIGPIPE as CPython does: with its stdout and stderr
// closed by the reader, it goes on serving.
func TestProcessSurvivesClosedOutput(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "m", "--port", "0", "--enable-log-requests")
	cmd.Env = append(os.Environ(), envRunMain+"=1")
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	var port string
	sc := bufio.NewScanner(r)
	for port == "" && sc.Scan() {
		if m := readyPortRE.FindStringSubmatch(sc.Text()); m != nil {
			port = m[1]
		}
	}
	if port == "" {
		t.Fatalf("no ready line: %v", sc.Err())
	}
	r.Close() // every later write of the engine fails with EPIPE
	for i := range 5 {
		b := post(t, "http://127.0.0.1:"+port+"/v1/completions", `{"prompt":"x","max_tokens":2}`, http.StatusOK)
		if !strings.Contains(string(b), "tok1") {
			t.Fatalf("request %d: %s", i, b)
		}
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
		t.Fatalf("engine died: %v", err)
	}
}

func TestProcessLongStartupLine(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-log-line-bytes", "70000")
	p.port(t)
	for line := range strings.SplitSeq(p.log(), "\n") {
		if len(line) == 70000 {
			return
		}
	}
	t.Fatal("no start-up line of 70000 characters")
}

func TestProcessTaskFlagExits2(t *testing.T) {
	t.Parallel()
	p := startSim(t, "/models/bge-m3", "--port", "0", "--task", "embed")
	if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 2 {
		t.Fatalf("status %v, want exit 2", st)
	}
	if !strings.Contains(p.log(), "error: unrecognized arguments: --task embed") {
		t.Fatalf("log:\n%s", p.log())
	}
}
