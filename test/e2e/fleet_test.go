package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// fleetd is one running fleetd in front of test hosts named host1, host2, …
type fleetd struct {
	t      *testing.T
	cmd    *exec.Cmd
	url    string
	stdout *lockedBuffer // the access log
	stderr *lockedBuffer
	exited chan struct{}
	// hostsPath is its hosts file.
	hostsPath string
}

// startFleetd runs fleetd over hosts (named host1… in order) with fast polls
// and ejection, and waits until it has polled every host.
func startFleetd(t *testing.T, hosts []*daemon, args ...string) *fleetd {
	t.Helper()
	return startFleetdWeighted(t, hosts, nil, args...)
}

// startFleetdWeighted is startFleetd with the hosts' weights (nil: 1 each).
func startFleetdWeighted(t *testing.T, hosts []*daemon, weights []int, args ...string) *fleetd {
	t.Helper()
	var list []map[string]any
	for i, d := range hosts {
		h := map[string]any{"name": fmt.Sprintf("host%d", i+1), "url": d.url}
		if weights != nil {
			h["weight"] = weights[i]
		}
		list = append(list, h)
	}
	data, _ := json.Marshal(map[string]any{"hosts": list})
	path := filepath.Join(t.TempDir(), "hosts.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	f := &fleetd{t: t, url: "http://" + addr, stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, exited: make(chan struct{}), hostsPath: path}
	all := append([]string{"--listen", addr, "--hosts", path, "--log-format", "json", "--log-level", "debug",
		"--poll-interval", "100ms", "--poll-timeout", "2s", "--eject-after", "2", "--max-backoff", "400ms"}, args...)
	f.cmd = exec.Command(fleetdBin, all...)
	f.cmd.Stdout, f.cmd.Stderr = f.stdout, f.stderr
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = f.cmd.Wait(); close(f.exited) }()
	t.Cleanup(func() {
		_ = f.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-f.exited:
		case <-time.After(30 * time.Second):
			t.Errorf("fleetd did not exit within 30s of SIGTERM")
			_ = f.cmd.Process.Kill()
			<-f.exited
		}
		if t.Failed() {
			t.Logf("fleetd stderr:\n%s", tail(f.stderr.String(), 40))
		}
	})
	for i := range hosts {
		f.waitHost(fmt.Sprintf("host%d", i+1), 20*time.Second, "healthy", func(h fleetHost) bool { return h.Healthy })
	}
	return f
}

// fleetHost is the part of a host in fleetd's /status the tests read.
type fleetHost struct {
	Name       string `json:"name"`
	Healthy    bool   `json:"healthy"`
	Ejected    bool   `json:"ejected"`
	EjectedFor string `json:"ejectedFor"`
	Models     []struct {
		Model  string `json:"model"`
		Health string `json:"health"`
	} `json:"models"`
	Pools []struct {
		Name     string  `json:"name"`
		State    string  `json:"state"`
		Profile  *string `json:"profile"`
		InFlight int     `json:"inFlight"`
	} `json:"pools"`
}

func (f *fleetd) hosts() map[string]fleetHost {
	f.t.Helper()
	resp, err := http.Get(f.url + "/status")
	if err != nil {
		f.t.Fatalf("GET fleetd /status: %v", err)
	}
	defer resp.Body.Close()
	var st struct {
		Hosts []fleetHost `json:"hosts"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		f.t.Fatal(err)
	}
	out := make(map[string]fleetHost)
	for _, h := range st.Hosts {
		out[h.Name] = h
	}
	return out
}

// waitHost polls fleetd's view of one host until cond holds.
func (f *fleetd) waitHost(name string, timeout time.Duration, what string, cond func(fleetHost) bool) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	var last fleetHost
	for time.Now().Before(deadline) {
		select {
		case <-f.exited:
			f.t.Fatalf("fleetd exited\n%s", f.stderr.String())
		default:
		}
		if resp, err := http.Get(f.url + "/health"); err == nil {
			resp.Body.Close()
			last = f.hosts()[name]
			if cond(last) {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.t.Fatalf("fleetd: host %s: %s not reached within %s; last %+v", name, what, timeout, last)
}

// post sends a chat request through fleetd and returns the status, the host
// that answered and the body.
func (f *fleetd) post(ctx context.Context, body string, header ...string) (int, string, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Fleet-Host"), string(b), err
}

// openStream starts a streaming chat request through fleetd and returns once
// its first event arrived, with the host serving it.
func (f *fleetd) openStream(ctx context.Context, model string, tokens int, header ...string) (*http.Response, *bufio.Reader) {
	f.t.Helper()
	body := fmt.Sprintf(`{"model": %q, "stream": true, "max_tokens": %d, "messages": [{"role": "user", "content": "go on"}]}`, model, tokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/chat/completions", strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		f.t.Fatalf("stream of %s: %d %s", model, resp.StatusCode, b)
	}
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		f.t.Fatalf("stream of %s: first line %q, %v", model, line, err)
	}
	return resp, rd
}

// hostProfiles is a host with one pool, gpu0, that may run every model, each
// loading in about a second.
func hostProfiles(tag, dflt string, models []string, flags ...string) []byte {
	var sims []sim
	for _, m := range models {
		sims = append(sims, sim{ID: m, Flags: append([]string{"--sim-load-delay", "1s", "--sim-itl", "20ms"}, flags...)})
	}
	return profilesJSON(tag, []pool{{Name: "gpu0", GPUs: []int{0}, Default: dflt}}, sims, nil)
}

const shortChat = `{"model": %q, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}`

// fleetd sends a request where its model is awake without causing a swap,
// and loads a model awake nowhere on an idle host, not on a busy one.
func TestFleetRouting(t *testing.T) {
	models := []string{"a", "b", "c"}
	h1 := startPoold(t, t.Name()+"-1", hostProfiles(t.Name()+"-1", "a", models))
	h2 := startPoold(t, t.Name()+"-2", hostProfiles(t.Name()+"-2", "b", models))
	h3 := startPoold(t, t.Name()+"-3", hostProfiles(t.Name()+"-3", "", models))
	h1.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	h2.waitPool("gpu0", 20*time.Second, "b ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "b" })
	f := startFleetd(t, []*daemon{h1, h2, h3})
	f.waitHost("host2", 5*time.Second, "b ready", func(h fleetHost) bool {
		return len(h.Pools) == 1 && h.Pools[0].Profile != nil && *h.Pools[0].Profile == "b"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "b"))
	if err != nil || code != http.StatusOK || host != "host2" {
		t.Fatalf("b: %d from %q: %s %v", code, host, body, err)
	}
	unchanged := func() {
		t.Helper()
		if p := h1.pool("gpu0"); p.Profile != "a" || p.SwitchingTo != "" {
			t.Fatalf("host1 swapped: %+v", p)
		}
		if p := h2.pool("gpu0"); p.Profile != "b" || p.SwitchingTo != "" {
			t.Fatalf("host2 swapped: %+v", p)
		}
	}
	unchanged()
	if p := h3.pool("gpu0"); p.State != "empty" || p.Engine != nil {
		t.Fatalf("host3 started an engine: %+v", p)
	}

	// Keep hosts 1 and 2 busy with streams of their models; c, awake
	// nowhere, must load on host 3.
	streams, stop := context.WithCancel(ctx)
	defer stop()
	for model, want := range map[string]string{"a": "host1", "b": "host2"} {
		resp, _ := f.openStream(streams, model, 2000)
		defer resp.Body.Close()
		if got := resp.Header.Get("X-Fleet-Host"); got != want {
			t.Fatalf("stream of %s went to %s, not %s", model, got, want)
		}
	}
	code, host, body, err = f.post(ctx, fmt.Sprintf(shortChat, "c"))
	if err != nil || code != http.StatusOK || host != "host3" {
		t.Fatalf("c: %d from %q: %s %v", code, host, body, err)
	}
	if p := h3.pool("gpu0"); p.Profile != "c" {
		t.Fatalf("host3 does not hold c: %+v", p)
	}
	unchanged()
	stop()

	// The decisions are in the access log.
	for _, want := range []map[string]any{
		{"model": "b", "reason": "awake", "host": "host2", "status": 200.0},
		{"model": "c", "reason": "empty", "host": "host3", "status": 200.0},
	} {
		if !f.logged(want) {
			t.Errorf("no access log line with %v:\n%s", want, f.stdout.String())
		}
	}
}

// logged reports whether an access log line has every field of want.
func (f *fleetd) logged(want map[string]any) bool {
	for line := range strings.Lines(f.stdout.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		match := true
		for k, v := range want {
			match = match && rec[k] == v
		}
		if match {
			return true
		}
	}
	return false
}

// Affinity, the OpenAI client, and a poold killed mid-run: its streams end
// with an error, new requests fail over without an error, and the host is
// ejected and re-admitted once it is back.
func TestFleetFailover(t *testing.T) {
	var hosts []*daemon
	var profiles [][]byte
	for i := range 3 {
		tag := fmt.Sprintf("%s-%d", t.Name(), i+1)
		profiles = append(profiles, hostProfiles(tag, "a", []string{"a"}))
		hosts = append(hosts, startPoold(t, tag, profiles[i]))
	}
	for _, h := range hosts {
		h.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	}
	f := startFleetd(t, hosts)
	for i := range hosts {
		f.waitHost(fmt.Sprintf("host%d", i+1), 5*time.Second, "a ready", func(h fleetHost) bool {
			return len(h.Pools) == 1 && h.Pools[0].State == "ready"
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Affinity: requests sharing a session key land on one host.
	sessionHost := make(map[string]string)
	for i := range 6 {
		key := fmt.Sprintf("session-%d", i)
		for range 3 {
			code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "a"), "X-Session-Id", key)
			if err != nil || code != http.StatusOK {
				t.Fatalf("%d %s %v", code, body, err)
			}
			if prev, ok := sessionHost[key]; ok && prev != host {
				t.Fatalf("%s went to %s, then %s", key, prev, host)
			}
			sessionHost[key] = host
		}
	}
	t.Logf("sessions: %v", sessionHost)

	t.Run("openai client", func(t *testing.T) {
		client := openai.NewClient(option.WithBaseURL(f.url+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
		msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("one two three")}
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "a", Messages: msgs, MaxTokens: openai.Int(3)})
		if err != nil || resp.Choices[0].Message.Content != "tok0 tok1 tok2 " || resp.Usage.CompletionTokens != 3 {
			t.Fatalf("chat: %+v %v", resp, err)
		}
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "a", Messages: msgs, MaxTokens: openai.Int(4)})
		var content string
		for stream.Next() {
			if c := stream.Current(); len(c.Choices) > 0 {
				content += c.Choices[0].Delta.Content
			}
		}
		if err := stream.Err(); err != nil || content != "tok0 tok1 tok2 tok3 " {
			t.Fatalf("stream: %q %v", content, err)
		}
	})

	// Kill the host of session-0 while it streams.
	victimName := sessionHost["session-0"]
	var victim *daemon
	var victimProfiles []byte
	var victimTag string
	for i, h := range hosts {
		if fmt.Sprintf("host%d", i+1) == victimName {
			victim, victimProfiles, victimTag = h, profiles[i], fmt.Sprintf("%s-%d", t.Name(), i+1)
		}
	}
	resp, rd := f.openStream(ctx, "a", 2000, "X-Session-Id", "session-0")
	defer resp.Body.Close()
	if got := resp.Header.Get("X-Fleet-Host"); got != victimName {
		t.Fatalf("session-0 streamed from %s, not %s", got, victimName)
	}
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.exited
	rest, err := io.ReadAll(rd)
	if err == nil || strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the stream of the killed host ended cleanly: %v\n%s", err, rest)
	}
	if !strings.Contains(string(rest), `"host_failed"`) {
		t.Fatalf("the stream of the killed host ended without fleetd's host_failed event:\n%s", rest)
	}
	// It is counted as cut, not as a success.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if v := metricSum(t, f.url, "fleetd_requests_total", `code_class="cut"`, `host="`+victimName+`"`); v == 1 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("fleetd_requests_total{code_class=cut,host=%s} = %v, want 1", victimName, v)
		}
	}

	// New requests, even for the dead host's session, fail over unseen.
	for i := range 8 {
		code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "a"), "X-Session-Id", "session-0")
		if err != nil || code != http.StatusOK || host == victimName {
			t.Fatalf("request %d after the kill: %d from %q: %s %v", i, code, host, body, err)
		}
	}
	f.waitHost(victimName, 10*time.Second, "ejected", func(h fleetHost) bool { return h.Ejected && !h.Healthy })

	// Restart it on the same address: it is re-admitted, and its session
	// comes back to it.
	again := launch(t, victimTag, victimProfiles, "--listen", strings.TrimPrefix(victim.url, "http://"))
	again.url = victim.url
	again.waitHealthy()
	again.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	f.waitHost(victimName, 10*time.Second, "re-admitted with a ready", func(h fleetHost) bool {
		return h.Healthy && !h.Ejected && len(h.Pools) == 1 && h.Pools[0].State == "ready"
	})
	code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "a"), "X-Session-Id", "session-0")
	if err != nil || code != http.StatusOK || host != victimName {
		t.Fatalf("after the restart: %d from %q (want %s): %s %v", code, host, victimName, body, err)
	}
}

// fleetd's own key list: without an accepted key a request ends at fleetd
// with a 401 and no host sees it; with one, the client's Authorization goes
// on to a poold that enforces the same key. fleetd polls that poold with its
// host key, and no key shows in fleetd's output.
func TestFleetAPIKeys(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	writeFile(t, keys, []byte("# clients\nsk-fleet-client\n"))
	hostKey := filepath.Join(dir, "host-key")
	writeFile(t, hostKey, []byte("sk-fleet-client\n"))
	tag := t.Name()
	h := startPoold(t, tag, hostProfiles(tag, "a", []string{"a"}), "--api-keys-file", keys)
	h.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	f := startFleetd(t, []*daemon{h}, "--api-keys-file", keys, "--host-api-key-file", hostKey)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer sk-wrong"}} {
		code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "a"), hdr...)
		if err != nil {
			t.Fatal(err)
		}
		if e := apiError(t, []byte(body)); code != http.StatusUnauthorized || e.Error.Code != "invalid_api_key" || host != "" {
			t.Fatalf("key %v: %d host %q %s", hdr, code, host, body)
		}
	}
	code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "a"), "Authorization", "Bearer sk-fleet-client")
	if err != nil || code != http.StatusOK || host != "host1" {
		t.Fatalf("with the key: %d host %q %s %v", code, host, body, err)
	}
	// poold logged exactly the one request that passed fleetd (its access
	// log is written behind the answer).
	poll(t, 10*time.Second, "poold's access-log line", func() bool { return strings.Contains(h.stdout.String(), `"msg":"request"`) })
	if n := strings.Count(h.stdout.String(), `"msg":"request"`); n != 1 {
		t.Fatalf("poold logged %d requests, want 1:\n%s", n, h.stdout.String())
	}
	for _, path := range []string{"/health", "/status"} {
		resp, err := http.Get(f.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s without a key: %d", path, resp.StatusCode)
		}
	}
	if out := f.stdout.String() + f.stderr.String(); strings.Contains(out, "sk-fleet-client") || strings.Contains(out, "sk-wrong") {
		t.Fatal("a key appears in fleetd's output")
	}
}
