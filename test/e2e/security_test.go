package e2e

// Security checks (docs/security.md): where engines listen, what reaches
// them, API-key enforcement, the admin API's default.

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// listeners returns the local addresses ("0100007F:1F90" in /proc's hex form)
// of the sockets in LISTEN state in /proc/net/tcp or tcp6 whose port is port.
func listeners(t *testing.T, port int) []string {
	t.Helper()
	want := fmt.Sprintf(":%04X", port)
	var out []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue // no IPv6 here
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// sl local_address rem_address st ...; st 0A is LISTEN.
			if len(fields) > 3 && fields[3] == "0A" && strings.HasSuffix(fields[1], want) {
				out = append(out, filepath.Base(f)+" "+fields[1])
			}
		}
		fh.Close()
	}
	return out
}

// Each engine listens on 127.0.0.1 only: the kernel's socket table shows its
// port bound to loopback, and to no wildcard or IPv6 address.
func TestEnginesListenOnLoopbackOnly(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a"}, {Name: "p1", GPUs: []int{1}, Default: "b"}},
		[]sim{{ID: "a", Pools: []string{"p0"}}, {ID: "b", Pools: []string{"p1"}}}, nil))
	for _, name := range []string{"p0", "p1"} {
		p := d.waitPool(name, 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
		got := listeners(t, p.Engine.Port)
		want := fmt.Sprintf("tcp 0100007F:%04X", p.Engine.Port)
		if len(got) != 1 || got[0] != want {
			t.Fatalf("pool %s engine on port %d listens on %v, want only %s", name, p.Engine.Port, got, want)
		}
	}
}

// The client's credentials never reach the engine: Authorization and
// x-api-key are stripped, other headers pass (the engine logs the names of
// the headers it got).
func TestCredentialsNotForwarded(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-log-headers"}}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	for _, stream := range []bool{false, true} {
		req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("m", stream, 2)))
		req.Header.Set("Authorization", "Bearer sk-client-secret")
		req.Header.Set("X-Api-Key", "sk-other-secret")
		req.Header.Set("X-Trace-Marker", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	var seen []string
	deadline := time.Now().Add(5 * time.Second)
	for len(seen) < 2 && time.Now().Before(deadline) {
		seen = seen[:0]
		for line := range strings.Lines(d.stderr.String()) {
			if strings.Contains(line, "request headers") && strings.Contains(line, "path=/v1/chat/completions") {
				seen = append(seen, line)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(seen) != 2 {
		t.Fatalf("the engine logged %d chat requests' headers, want 2", len(seen))
	}
	for _, line := range seen {
		if !strings.Contains(line, "X-Trace-Marker") || strings.Contains(line, "Authorization") || strings.Contains(line, "X-Api-Key") {
			t.Fatalf("engine saw headers: %s", line)
		}
	}
	if out := d.stdout.String() + d.stderr.String(); strings.Contains(out, "secret") {
		t.Fatalf("a credential reached poold's logs")
	}
}

// With API keys set, the OpenAI API wants one of them (401 in the OpenAI
// shape otherwise); the keys appear in no log and no label; the operations
// endpoints stay open; the admin API stays unbound without its token.
func TestAPIKeys(t *testing.T) {
	dir := t.TempDir()
	hashed := sha256.Sum256([]byte("sk-hashed-key"))
	keysFile := filepath.Join(dir, "keys")
	writeFile(t, keysFile, []byte("# poold keys\nsk-plain-key\n\nsha256:"+hex.EncodeToString(hashed[:])+"\n"))

	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "m"}}, nil),
		"--api-keys-file", keysFile)
	send := func(path, header, value string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, d.url+path, strings.NewReader(chatBody("m", false, 2)))
		if header != "" {
			req.Header.Set(header, value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b := make([]byte, 4096)
		n, _ := resp.Body.Read(b)
		return resp.StatusCode, b[:n]
	}
	for _, c := range []struct{ path, header, value string }{
		{"/v1/chat/completions", "", ""},
		{"/v1/chat/completions", "Authorization", "Bearer sk-wrong-key"},
		{"/v1/chat/completions", "X-Api-Key", "sk-plain-key-but-longer"},
		{"/pools/p0/v1/chat/completions", "", ""},
	} {
		code, body := send(c.path, c.header, c.value)
		if e := apiError(t, body); code != http.StatusUnauthorized || e.Error.Code != "invalid_api_key" || e.Error.Type != "authentication_error" {
			t.Fatalf("%s with %s %q: %d %s", c.path, c.header, c.value, code, body)
		}
	}
	for _, c := range []struct{ header, value string }{
		{"Authorization", "Bearer sk-plain-key"},
		{"X-Api-Key", "sk-hashed-key"},
	} {
		if code, body := send("/v1/chat/completions", c.header, c.value); code != http.StatusOK {
			t.Fatalf("%s %q: %d %s", c.header, c.value, code, body)
		}
	}
	for _, path := range []string{"/health", "/status", "/metrics"} {
		resp, err := http.Get(d.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
	}
	if code, _ := send("/admin/pools/p0/unload", "Authorization", "Bearer sk-plain-key"); code != http.StatusNotFound {
		t.Fatalf("admin API without an admin token: %d, want 404 (unbound)", code)
	}
	all := d.stdout.String() + d.stderr.String() + scrapeText(t, d)
	for _, secret := range []string{"sk-plain-key", "sk-hashed-key", "sk-wrong-key"} {
		if strings.Contains(all, secret) {
			t.Fatalf("key %q appears in the logs or metrics", secret)
		}
	}
	resp, err := http.Get(d.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/models without a key: %d", resp.StatusCode)
	}
}

// An engine inherits only an allowlist of poold's environment, what its
// profile sets, and what its profile names in passEnv: poold's API keys and
// admin token (POOLD_*), unrelated secrets and VLLM_API_KEY never reach it.
func TestEngineEnvironmentAllowlisted(t *testing.T) {
	tag := t.Name()
	d := launchWith(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Extra: map[string]any{"passEnv": []string{"MY_VAR"}}}}, nil),
		func(cmd *exec.Cmd) {
			cmd.Env = append(os.Environ(), "POOLD_API_KEYS=sk-env-secret", "POOLD_ADMIN_TOKEN=admin-env-secret", "UNLISTED_SECRET=other-env-secret",
				"VLLM_API_KEY=engine-env-secret", "HF_HOME=/tmp/hf-e2e", "MY_VAR=passed-on-purpose")
		})
	d.waitHealthy()
	p := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.Engine.PID))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.Contains(kv, "secret") || (strings.HasPrefix(k, "POOLD_") && k != "POOLD_ENGINE_TOKEN" && k != "POOLD_E2E_TAG") {
			t.Errorf("the engine inherited %s", kv)
		}
	}
	for _, want := range []string{"HF_HOME=/tmp/hf-e2e", "MY_VAR=passed-on-purpose", "POOLD_E2E_TAG=" + runTag(tag), "CUDA_VISIBLE_DEVICES=0"} {
		if !slices.Contains(env, want) {
			t.Errorf("the engine's environment lacks %s: %q", want, env)
		}
	}
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
		t.Errorf("the engine's environment lacks PATH: %q", env)
	}
}

// Only inference routes reach an engine: paths that an engine normalising
// them would read as its control endpoints (dot-segments, encoded or not,
// encoded slashes) and every path that is not an inference route get poold's
// own 404 before any swap, and the engine never sees them; vLLM's un-prefixed
// inference routes and pinned paths are forwarded as they are.
func TestOnlyInferenceRoutesReachEngines(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a"}},
		[]sim{{ID: "a"}, {ID: "b"}}, nil))
	before := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	for _, path := range []string{
		"/v1/%2e%2e/sleep?level=1",
		"/v1/..%2fcollective_rpc",
		"/pools/p0/v1/..%2fsleep",
		"/v1/chat/completions%2f..%2f..%2fcollective_rpc",
		"/v1/foo", "/v1/load_lora_adapter", "/sleep?level=1", "/wake_up", "/collective_rpc",
		"/reset_prefix_cache", "/pools/p0/sleep", "/v1/chat/completions/", "/v1/chat%2Fcompletions",
	} {
		code, _, body, err := d.post(t.Context(), path, chatBody("b", false, 1))
		if err != nil {
			t.Fatal(err)
		}
		if e := apiError(t, body); code != http.StatusNotFound || e.Error.Code != "unknown_route" {
			t.Errorf("POST %s: %d %s, want 404 unknown_route", path, code, body)
		}
	}
	if p := d.pool("p0"); p.State != "ready" || p.Profile != "a" || p.Engine == nil || p.Engine.PID != before.Engine.PID {
		t.Fatalf("after the refused paths the pool is %+v, want still a on pid %d (no swap)", p, before.Engine.PID)
	}
	// vLLM's un-prefixed routes are forwarded as such (the simulator serves
	// /tokenize, as vLLM does), pinned paths too.
	if code, _, body, err := d.post(t.Context(), "/tokenize", `{"model":"a","prompt":"hi"}`); err != nil || code != http.StatusOK || !strings.Contains(string(body), `"tokens"`) {
		t.Fatalf("POST /tokenize: %d %s %v, want the engine's answer", code, body, err)
	}
	if code, _, body, err := d.post(t.Context(), "/pools/p0/v1/chat/completions", chatBody("a", false, 1)); err != nil || code != http.StatusOK {
		t.Fatalf("pinned chat: %d %s %v", code, body, err)
	}
	seen := enginePaths(t, d, "/v1/chat/completions")
	for p := range seen {
		if p != "/v1/chat/completions" && p != "/tokenize" {
			t.Errorf("the engine received POST %s", p)
		}
	}
	if !seen["/tokenize"] {
		t.Errorf("the engine never received /tokenize: %v", seen)
	}
}

// enginePaths waits until the engines' access log lines (in poold's log)
// show a POST of last, and returns every path they show POSTed.
func enginePaths(t *testing.T, d *daemon, last string) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(` - "POST (\S+) HTTP/1\.1" `)
	deadline := time.Now().Add(10 * time.Second)
	for {
		seen := map[string]bool{}
		for _, m := range d.engineLines(`"POST `) {
			l, _ := m["line"].(string)
			if sub := re.FindStringSubmatch(l); sub != nil {
				seen[sub[1]] = true
			}
		}
		if seen[last] || time.Now().After(deadline) {
			if !seen[last] {
				t.Fatalf("no engine request log line for %s: %v", last, seen)
			}
			return seen
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A body that names its model twice, or in another case ("MODEL", which a
// case-insensitive engine would read), is refused with a 400 naming the key:
// poold never routes on one model while the engine serves another.
func TestAmbiguousModelRefused(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a"}},
		[]sim{{ID: "a", Aliases: []string{"a-alias"}}, {ID: "b"}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	for body, param := range map[string]string{
		`{"model":"a-alias","MODEL":"b","messages":[{"role":"user","content":"hi"}]}`: "MODEL",
		`{"Model":"b","model":"a","messages":[{"role":"user","content":"hi"}]}`:       "Model",
		`{"model":"a","model":"b","messages":[{"role":"user","content":"hi"}]}`:       "model",
	} {
		code, _, resp, err := d.post(t.Context(), "/v1/chat/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		e := apiError(t, resp)
		if code != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != param || !strings.Contains(e.Error.Message, `"`+param+`"`) {
			t.Errorf("%s: %d %s, want 400 naming %q", body, code, resp, param)
		}
	}
}

// Headers: poold forwards a bounded set of the client's headers (431 past the
// bounds, before any engine sees the request), never its credentials,
// cookies, proxy or hop-by-hop headers; an engine's response headers are
// bounded too (a clear 502 past 1 MiB).
func TestHeadersBounded(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}, {Name: "p1", GPUs: []int{1}, Default: "big"}},
		[]sim{{ID: "m", Pools: []string{"p0"}, Flags: []string{"--sim-log-headers"}}, helperSim(tag, "big", "big-headers")}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	d.waitPool("p1", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	send := func(model string, hdr http.Header) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody(model, false, 1)))
		for k, vs := range hdr {
			req.Header[k] = vs
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	many := http.Header{}
	for i := range 100 {
		many.Set(fmt.Sprintf("X-Many-%d", i), "1")
	}
	for name, hdr := range map[string]http.Header{
		"100 headers":     many,
		"9 KiB of header": {"X-Big": {strings.Repeat("b", 9<<10)}},
	} {
		code, body := send("m", hdr)
		if e := apiError(t, body); code != http.StatusRequestHeaderFieldsTooLarge || e.Error.Code != "headers_too_large" {
			t.Errorf("%s: %d %s, want 431 headers_too_large", name, code, body)
		}
	}
	code, body := send("m", http.Header{
		"X-Trace-Marker": {"1"}, "Authorization": {"Bearer sk-x"}, "Cookie": {"session=1"},
		"Connection": {"X-Hop"}, "X-Hop": {"1"}, "Proxy-Authorization": {"Basic eA=="}, "X-Forwarded-For": {"10.0.0.1"},
	})
	if code != http.StatusOK {
		t.Fatalf("a request with ordinary headers: %d %s", code, body)
	}
	var seen []string
	for deadline := time.Now().Add(10 * time.Second); len(seen) == 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for line := range strings.Lines(d.stderr.String()) {
			if strings.Contains(line, "request headers") && strings.Contains(line, "path=/v1/chat/completions") {
				seen = append(seen, line)
			}
		}
	}
	if len(seen) != 1 {
		t.Fatalf("the engine logged %d chat requests' headers, want 1 (the refused ones never reach it): %q", len(seen), seen)
	}
	for _, h := range []string{"Authorization", "Cookie", "X-Hop", "Proxy-Authorization", "X-Forwarded-For", "X-Many-"} {
		if strings.Contains(seen[0], h) {
			t.Errorf("the engine received %s: %s", h, seen[0])
		}
	}
	if !strings.Contains(seen[0], "X-Trace-Marker") {
		t.Errorf("the engine did not receive X-Trace-Marker: %s", seen[0])
	}

	code, body = send("big", nil)
	if e := apiError(t, body); code != http.StatusBadGateway || !strings.Contains(e.Error.Message, "response header block too large") {
		t.Fatalf("an engine answering 2 MiB of headers: %d %s, want a 502 saying so", code, body)
	}
}

// A request the engine read whole is never sent to it again: an engine that
// drops a request it received on a kept connection gets it once, and the
// client a 502 (a replay would run the GPU work twice). An engine's answer
// sent before it read the whole body (an early 413) reaches the client as
// that answer, and is logged with its status, not as a failed forward.
func TestNoReplaysAndEarlyAnswers(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "drop"}, {Name: "p1", GPUs: []int{1}, Default: "early"}},
		[]sim{helperSim(tag, "drop", "drop-second"), helperSim(tag, "early", "early-413")}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	d.waitPool("p1", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	body := func(marker string) string { return `{"model":"drop","prompt":"` + marker + `"}` }
	if code, _, b, err := d.post(t.Context(), "/v1/completions", body("first")); err != nil || code != http.StatusOK {
		t.Fatalf("first request: %d %s %v", code, b, err)
	}
	// The second request goes out on the kept connection, where the engine
	// reads it and drops it.
	if code, _, b, err := d.post(t.Context(), "/v1/completions", body("second")); err != nil || code != http.StatusBadGateway {
		t.Fatalf("a request the engine dropped: %d %s %v, want 502", code, b, err)
	}
	// A third one, on a new connection, marks the end of what the engine
	// received for the second.
	if code, _, b, err := d.post(t.Context(), "/v1/completions", body("third")); err != nil || code != http.StatusOK {
		t.Fatalf("third request: %d %s %v", code, b, err)
	}
	var logged string
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logged, "third") && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		logged = d.stderr.String()
	}
	if n := strings.Count(logged, `received {\"model\":\"drop\",\"prompt\":\"second\"}`); n != 1 {
		t.Fatalf("the engine received the dropped request %d times, want once", n)
	}

	// An early 413 for a body larger than the socket buffers can hold.
	big := `{"model":"early","prompt":"` + strings.Repeat("x", 24<<20) + `"}`
	code, _, b, err := d.post(t.Context(), "/v1/completions", big)
	if err != nil || code != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "too large for this engine") {
		t.Fatalf("an early 413: %d %.200s %v, want the engine's 413", code, b, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if strings.Contains(d.stdout.String(), `"profile":"early","client":"none","status":413`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no access log line with status 413:\n%s", d.stdout.String())
		}
	}
}

// An engine that listens beyond loopback (the simulator with --host 0.0.0.0)
// is stopped and its load fails with a clear error, unless its pool sets
// allowNonLoopback, where it serves with the exposure in lastError.
func TestNonLoopbackEngineRefused(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "open"}, {Name: "p1", GPUs: []int{1}, Default: "allowed", Extra: map[string]any{"allowNonLoopback": true}}},
		[]sim{{ID: "open", Pools: []string{"p0"}, Flags: []string{"--host", "0.0.0.0"}}, {ID: "allowed", Pools: []string{"p1"}, Flags: []string{"--host", "0.0.0.0"}}}, nil))
	p := d.waitPool("p0", 20*time.Second, "failed", func(p poolView) bool { return p.State == "failed" })
	if !strings.Contains(p.LastError, "listens beyond loopback") || !strings.Contains(p.LastError, "allowNonLoopback") || p.Engine != nil {
		t.Fatalf("pool p0: %+v, want failed naming the exposure and allowNonLoopback, with no engine", p)
	}
	code, _, body, err := d.post(t.Context(), "/v1/chat/completions", chatBody("open", false, 1))
	if err != nil || code != http.StatusBadGateway || !strings.Contains(string(body), "listens beyond loopback") {
		t.Fatalf("a request for the refused engine: %d %s %v, want a 502 naming the exposure", code, body, err)
	}
	p = d.waitPool("p1", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	if !strings.Contains(p.LastError, "listens beyond loopback") {
		t.Fatalf("pool p1 allows the exposure but its lastError is %q", p.LastError)
	}
	if !strings.Contains(d.stderr.String(), "engine listens beyond loopback") {
		t.Fatal("the exposure is not in the log")
	}
}

// An engine started on a port that another process also listens on with
// SO_REUSEPORT (the kernel would split requests between them) is not taken
// as ready: poold sees the other listener in /proc, stops the engine and
// starts it on another port, and no request reaches the other process.
func TestSharedPortRefused(t *testing.T) {
	tag := t.Name()
	armed := filepath.Join(t.TempDir(), "armed")
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{helperSim(tag, "m", "reuseport", armed)}, nil))
	// The engine waits for the file; meanwhile this process takes its port.
	p := d.waitPool("p0", 20*time.Second, "an engine starting", func(p poolView) bool { return p.Engine != nil })
	shared := p.Engine.Port
	lc := net.ListenConfig{Control: reusePort}
	ln, err := lc.Listen(t.Context(), "tcp", fmt.Sprintf("127.0.0.1:%d", shared))
	if err != nil {
		t.Fatal(err)
	}
	squatter := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			modelList(w, "m")
			return
		}
		fmt.Fprint(w, `{"served_by":"squatter"}`)
	})}
	go squatter.Serve(ln)
	t.Cleanup(func() { squatter.Close() })
	writeFile(t, armed, nil)

	p = d.waitPool("p0", 30*time.Second, "ready on another port", func(p poolView) bool {
		return p.State == "ready" && p.Engine != nil && p.Engine.Port != shared
	})
	if !strings.Contains(d.stderr.String(), "another process listens on the engine's port") {
		t.Fatal("the shared port is not in the log")
	}
	for range 10 {
		code, _, body, err := d.post(t.Context(), "/v1/chat/completions", chatBody("m", false, 1))
		if err != nil || code != http.StatusOK || !strings.Contains(string(body), `"served_by":"engine"`) {
			t.Fatalf("request: %d %s %v, want the engine's answer", code, body, err)
		}
	}
}

// A port clash is recognised whatever the engine's wording or case:
// Python's "[Errno 98] Address already in use" and newer vLLM's "Port N is
// already in use" both start the engine again on another port.
func TestPortClashMessages(t *testing.T) {
	tag := t.Name()
	clash := func(msg string) []string {
		return []string{"sh", "-c", "echo '" + msg + "' >&2; exit 1 # {port}"}
	}
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}},
		[]sim{
			{ID: "python", Extra: map[string]any{"command": clash("OSError: [Errno 98] Address already in use")}},
			{ID: "vllm", Extra: map[string]any{"command": clash("RuntimeError: Port {port} is already in use")}},
		}, nil))
	for _, id := range []string{"python", "vllm"} {
		code, _, body, err := d.post(t.Context(), "/v1/chat/completions", chatBody(id, false, 1))
		if err != nil || code != http.StatusBadGateway {
			t.Fatalf("%s: %d %s %v", id, code, body, err)
		}
		if msg := apiError(t, body).Error.Message; !strings.Contains(msg, "found its port taken 3 times in a row") {
			t.Fatalf("%s: the clash was not recognised: %s", id, msg)
		}
	}
}
