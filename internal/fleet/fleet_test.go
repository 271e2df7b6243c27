package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/statusapi"
)

// fakeHost is a poold stand-in: /status and /v1/models from its fields, POST
// /v1/* answered by post (200 {"ok":"NAME"} when nil).
type fakeHost struct {
	name string
	srv  *httptest.Server

	mu        sync.Mutex // guards the fields below
	pools     []statusapi.Pool
	models    []hostModel
	failPolls bool
	// hold, when not nil, holds every poll until it is closed (or the poll
	// is given up).
	hold  chan struct{}
	post  http.HandlerFunc
	posts int
	auth  []string // Authorization of each POST
	paths []string // the path of each POST
}

func newFakeHost(t testing.TB, name string, pools []statusapi.Pool, models ...hostModel) *fakeHost {
	t.Helper()
	fh := &fakeHost{name: name, pools: pools, models: models}
	fh.srv = httptest.NewServer(http.HandlerFunc(fh.serve))
	t.Cleanup(fh.srv.Close)
	return fh
}

func (fh *fakeHost) serve(w http.ResponseWriter, r *http.Request) {
	fh.mu.Lock()
	if hold := fh.hold; hold != nil && r.Method == http.MethodGet {
		fh.mu.Unlock()
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
		fh.mu.Lock()
	}
	fail, post := fh.failPolls, fh.post
	switch {
	case r.Method == http.MethodGet && fail:
		fh.mu.Unlock()
		http.Error(w, "broken", http.StatusInternalServerError)
		return
	case r.URL.Path == "/status":
		b, _ := json.Marshal(hostStatus{Version: "test", Host: fh.name, Pools: fh.pools})
		fh.mu.Unlock()
		w.Write(b)
		return
	case r.URL.Path == "/v1/models" && r.Method == http.MethodGet:
		b, _ := json.Marshal(map[string]any{"object": "list", "data": fh.models})
		fh.mu.Unlock()
		w.Write(b)
		return
	}
	fh.posts++
	fh.auth = append(fh.auth, r.Header.Get("Authorization"))
	fh.paths = append(fh.paths, r.URL.Path)
	fh.mu.Unlock()
	if post != nil {
		post(w, r)
		return
	}
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id")) // as poold answers
	fmt.Fprintf(w, `{"ok":%q}`, fh.name)
}

func (fh *fakeHost) set(f func(fh *fakeHost)) {
	fh.mu.Lock()
	defer fh.mu.Unlock()
	f(fh)
}

func (fh *fakeHost) postCount() int {
	fh.mu.Lock()
	defer fh.mu.Unlock()
	return fh.posts
}

func (fh *fakeHost) spec() HostSpec { return HostSpec{Name: fh.name, URL: fh.srv.URL, Weight: 1} }

func ptr(s string) *string { return &s }

func readyPool(name, profile string, inFlight int) statusapi.Pool {
	return statusapi.Pool{Name: name, State: statusapi.StateReady, Profile: ptr(profile), InFlight: inFlight, Gate: "open"}
}

// saturatedPool is a ready pool whose engine queues 11 requests (one past
// DefaultSaturation), sampled now.
func saturatedPool(name, profile string) statusapi.Pool {
	p := readyPool(name, profile, 4)
	p.EngineStats = &statusapi.EngineStats{Running: 4, Waiting: 11, KVCacheUsage: 0.5, SampledAt: time.Now()}
	return p
}

func emptyPool(name string) statusapi.Pool {
	return statusapi.Pool{Name: name, State: statusapi.StateEmpty, Gate: "closed"}
}

func model(id, root string) hostModel { return hostModel{ID: id, Root: root, State: "available"} }

// testFleet runs a fleet over hosts until the test ends, and serves its handler.
type testFleet struct {
	t       testing.TB
	fleet   *Fleet
	handler *Handler
	srv     *httptest.Server
	reg     *prometheus.Registry
}

func startFleet(t testing.TB, fo Options, ho HandlerOptions, hosts ...*fakeHost) *testFleet {
	t.Helper()
	reg := prometheus.NewRegistry()
	if fo.Metrics == nil {
		fo.Metrics = NewMetrics(reg)
	}
	if fo.PollInterval == 0 {
		fo.PollInterval = 10 * time.Millisecond
	}
	f := New(fo)
	file := &File{}
	for _, h := range hosts {
		file.Hosts = append(file.Hosts, h.spec())
	}
	f.Apply(file)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	h := NewHandler(f, ho)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tf := &testFleet{t: t, fleet: f, handler: h, srv: srv, reg: reg}
	for _, fh := range hosts {
		tf.waitHost(fh.name, "healthy", func(s statusapi.Host) bool { return s.Healthy })
	}
	return tf
}

// waitHost polls the fleet view until cond holds for host, failing after 5 s.
func (tf *testFleet) waitHost(name, what string, cond func(statusapi.Host) bool) statusapi.Host {
	tf.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var last statusapi.Host
	for time.Now().Before(deadline) {
		hosts, _ := tf.fleet.Status()
		for _, h := range hosts {
			if h.Name == name {
				last = h
				if cond(h) {
					return h
				}
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	tf.t.Fatalf("host %s: %s not reached in 5s; last %+v", name, what, last)
	return last
}

func (tf *testFleet) post(body string, header ...string) (*http.Response, string) {
	tf.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, tf.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tf.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

const chat = `{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}`

// A request goes to the host where its model is awake, not to an idle one,
// with the client's Authorization, and the choice is named in X-Fleet-Host.
func TestForwardToAwakeHost(t *testing.T) {
	idle := newFakeHost(t, "idle", []statusapi.Pool{emptyPool("gpu0")}, model("chat", "qwen"), model("qwen", "qwen"))
	awake := newFakeHost(t, "awake", []statusapi.Pool{readyPool("gpu0", "qwen", 2)}, model("chat", "qwen"), model("qwen", "qwen"))
	tf := startFleet(t, Options{}, HandlerOptions{}, idle, awake)
	resp, body := tf.post(chat, "Authorization", "Bearer sk-1")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Fleet-Host") != "awake" || body != `{"ok":"awake"}` {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if ids := resp.Header.Values("X-Request-Id"); len(ids) != 1 || ids[0] == "" {
		t.Fatalf("X-Request-Id %q, want one", ids)
	}
	awake.set(func(fh *fakeHost) {
		if len(fh.auth) != 1 || fh.auth[0] != "Bearer sk-1" {
			t.Errorf("Authorization at the host: %q", fh.auth)
		}
	})
	if n := idle.postCount(); n != 0 {
		t.Fatalf("idle host got %d requests", n)
	}
	if v := testutil.ToFloat64(tf.fleet.metrics.decisions.WithLabelValues("awake")); v != 1 {
		t.Fatalf("awake decisions = %v", v)
	}
	if v := testutil.ToFloat64(tf.fleet.metrics.requests.WithLabelValues("awake", "chat", "2xx")); v != 1 {
		t.Fatalf("requests = %v", v)
	}
}

func TestErrors(t *testing.T) {
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	tf := startFleet(t, Options{}, HandlerOptions{MaxBodyBytes: 1000}, h)
	cases := []struct {
		body   string
		status int
		code   string
	}{
		{`{"model": "nope", "messages": []}`, http.StatusNotFound, "model_not_found"},
		{`{"messages": []}`, http.StatusBadRequest, "invalid_body"},
		{`not json`, http.StatusBadRequest, "invalid_body"},
		{`{"model": "qwen", "pad": "` + strings.Repeat("x", 1000) + `"}`, http.StatusRequestEntityTooLarge, "body_too_large"},
	}
	for _, c := range cases {
		resp, body := tf.post(c.body)
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != c.status || e.Error.Code != c.code {
			t.Errorf("%.40s: %d %s", c.body, resp.StatusCode, body)
		}
		if c.code == "model_not_found" && !strings.Contains(e.Error.Message, "available models: qwen") {
			t.Errorf("404 does not list the models: %s", e.Error.Message)
		}
	}
	if n := h.postCount(); n != 0 {
		t.Fatalf("the host got %d bad requests", n)
	}

	// Known, but on no healthy host.
	h.set(func(fh *fakeHost) { fh.failPolls = true })
	tf.waitHost("h", "ejected", func(s statusapi.Host) bool { return s.Ejected })
	resp, body := tf.post(`{"model": "qwen"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "no_healthy_host") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// A host that fails EjectAfter polls in a row is ejected, probed back, and
// re-admitted once it answers.
func TestEjectAndReadmit(t *testing.T) {
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	tf := startFleet(t, Options{EjectAfter: 2, MaxBackoff: 40 * time.Millisecond}, HandlerOptions{}, h)
	h.set(func(fh *fakeHost) { fh.failPolls = true })
	st := tf.waitHost("h", "ejected", func(s statusapi.Host) bool { return s.Ejected })
	if st.Healthy || st.Reachable || st.PollFailures < 2 || st.LastError == nil {
		t.Fatalf("ejected host: %+v", st)
	}
	if v := testutil.ToFloat64(tf.fleet.metrics.hostUp.WithLabelValues("h")); v != 0 {
		t.Fatalf("fleetd_host_up = %v", v)
	}
	h.set(func(fh *fakeHost) { fh.failPolls = false })
	tf.waitHost("h", "re-admitted", func(s statusapi.Host) bool { return s.Healthy && !s.Ejected && s.PollFailures == 0 })
	if v := testutil.ToFloat64(tf.fleet.metrics.ejections.WithLabelValues("h", "poll")); v != 1 {
		t.Fatalf("ejections = %v", v)
	}
	if v := testutil.ToFloat64(tf.fleet.metrics.hostUp.WithLabelValues("h")); v != 1 {
		t.Fatalf("fleetd_host_up = %v", v)
	}
}

// A host that refuses connections is skipped for the next best one, and
// after EjectAfter failed forwards it is ejected.
func TestRetryOnConnectFailure(t *testing.T) {
	dead := newFakeHost(t, "dead", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	live := newFakeHost(t, "live", []statusapi.Pool{readyPool("gpu0", "qwen", 5)}, model("qwen", "qwen"))
	// Poll once (the first poll is at once), then not for the test's length,
	// so that only forwards can find the dead host out.
	tf := startFleet(t, Options{PollInterval: time.Hour, EjectAfter: 2}, HandlerOptions{}, dead, live)
	dead.srv.Close()
	for i := range 2 {
		resp, body := tf.post(`{"model": "qwen"}`)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Fleet-Host") != "live" {
			t.Fatalf("request %d: %d %v %s", i, resp.StatusCode, resp.Header, body)
		}
	}
	tf.waitHost("dead", "ejected", func(s statusapi.Host) bool { return s.Ejected && s.ForwardFailures == 2 })
	if v := testutil.ToFloat64(tf.fleet.metrics.retries.WithLabelValues("dead", "connect")); v != 2 {
		t.Fatalf("retries = %v", v)
	}
	resp, _ := tf.post(`{"model": "qwen"}`)
	if resp.Header.Get("X-Fleet-Host") != "live" {
		t.Fatal("not live")
	}
	if v := testutil.ToFloat64(tf.fleet.metrics.retries.WithLabelValues("dead", "connect")); v != 2 {
		t.Fatalf("an ejected host was tried: retries = %v", v)
	}
}

// A 503 that poold marks as refused before anything started moves the
// request to the next host; on the last host, or without the mark (a queue
// wait that timed out, whose load is under way), the 503 reaches the client
// as it is, Retry-After included.
func TestRetryOn503(t *testing.T) {
	unavailable := func(refused string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "7")
			if refused != "" {
				w.Header().Set(openai.RefusedHeader, refused)
			}
			http.Error(w, `{"error": {"message": "queue full"}}`, http.StatusServiceUnavailable)
		}
	}
	full := newFakeHost(t, "full", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	other := newFakeHost(t, "other", []statusapi.Pool{readyPool("gpu0", "qwen", 9)}, model("qwen", "qwen"))
	full.set(func(fh *fakeHost) { fh.post = unavailable("queue_full") })
	tf := startFleet(t, Options{}, HandlerOptions{}, full, other)
	resp, body := tf.post(`{"model": "qwen"}`)
	if resp.StatusCode != http.StatusOK || body != `{"ok":"other"}` {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if v := testutil.ToFloat64(tf.fleet.metrics.retries.WithLabelValues("full", "full")); v != 1 {
		t.Fatalf("retries = %v", v)
	}
	other.set(func(fh *fakeHost) { fh.post = unavailable("queue_full") })
	resp, body = tf.post(`{"model": "qwen"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "7" || !strings.Contains(body, "queue full") {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if resp.Header.Get(openai.RefusedHeader) != "" {
		t.Fatal("the client sees poold's X-Poold-Refused")
	}
	// A full queue sheds load: nobody is ejected for it.
	for _, name := range []string{"full", "other"} {
		if st := tf.waitHost(name, "healthy", func(s statusapi.Host) bool { return true }); !st.Healthy || st.ForwardFailures != 0 || len(st.Models) != 0 {
			t.Fatalf("%s: %+v", name, st)
		}
	}

	// A queue timeout is not retried: another host would start a second load.
	full.set(func(fh *fakeHost) { fh.post = unavailable(""); fh.posts = 0 })
	other.set(func(fh *fakeHost) { fh.post = nil; fh.posts = 0 })
	resp, body = tf.post(`{"model": "qwen"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "7" || resp.Header.Get("X-Fleet-Host") != "full" {
		t.Fatalf("queue timeout: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := other.postCount(); n != 0 {
		t.Fatalf("a queue timeout was retried on another host (%d requests)", n)
	}
}

// After a full queue, the request goes on only to a host where the model is
// awake or loading: a retry never starts another copy.
func TestFullQueueRetriesOnlyWarmHosts(t *testing.T) {
	full := newFakeHost(t, "full", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	cold := newFakeHost(t, "cold", []statusapi.Pool{emptyPool("gpu0")}, model("qwen", "qwen"))
	full.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(openai.RefusedHeader, "queue_full")
			http.Error(w, "full", http.StatusServiceUnavailable)
		}
	})
	tf := startFleet(t, Options{}, HandlerOptions{}, full, cold)
	resp, body := tf.post(`{"model": "qwen"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Fleet-Host") != "full" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := cold.postCount(); n != 0 {
		t.Fatalf("the cold host got %d requests after a full queue", n)
	}
}

// Once a byte reached the client, a failing host is not retried: the stream
// ends with an error event and the connection is cut.
func TestNoRetryAfterBytes(t *testing.T) {
	sent := make(chan struct{})
	breaks := newFakeHost(t, "breaks", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	spare := newFakeHost(t, "spare", []statusapi.Pool{readyPool("gpu0", "qwen", 9)}, model("qwen", "qwen"))
	breaks.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"n\": 1}\n\n")
			w.(http.Flusher).Flush()
			<-sent
			panic(http.ErrAbortHandler) // the host dies mid-stream
		}
	})
	tf := startFleet(t, Options{}, HandlerOptions{}, breaks, spare)
	resp, err := http.Post(tf.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model": "qwen", "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	// The first event arrives while the host still holds the stream open:
	// nothing is buffered.
	line, err := rd.ReadString('\n')
	if err != nil || line != "data: {\"n\": 1}\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	close(sent)
	rest, err := io.ReadAll(rd)
	if err == nil {
		t.Fatal("the stream ended cleanly after the host failed")
	}
	// The event is fleetd's and says what broke: the host, not an engine.
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	data, ok := strings.CutPrefix(strings.TrimSpace(string(rest)), "data: ")
	if !ok || json.Unmarshal([]byte(data), &e) != nil {
		t.Fatalf("no error event: %q", rest)
	}
	if e.Error.Code != "host_failed" || e.Error.Type != "server_error" || !strings.Contains(e.Error.Message, `host "breaks" failed`) {
		t.Fatalf("error event %q, want host_failed naming the host", rest)
	}
	if n := spare.postCount(); n != 0 {
		t.Fatalf("retried after bytes were sent: spare got %d", n)
	}
}

// Requests sharing a session key land on the same host among equals, and
// different keys use both hosts.
func TestAffinity(t *testing.T) {
	a := newFakeHost(t, "a", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("chat", "qwen"), model("qwen", "qwen"))
	b := newFakeHost(t, "b", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	tf := startFleet(t, Options{}, HandlerOptions{}, a, b)
	seen := make(map[string]bool)
	for i := 0; i < 64 && len(seen) < 2; i++ {
		key := fmt.Sprintf("s%d", i)
		first := ""
		for range 3 {
			resp, _ := tf.post(`{"model": "qwen"}`, "X-Session-Id", key)
			got := resp.Header.Get("X-Fleet-Host")
			if first == "" {
				first = got
			}
			if got != first {
				t.Fatalf("session %s went to %s, then %s", key, first, got)
			}
		}
		seen[first] = true
	}
	if len(seen) != 2 {
		t.Fatalf("64 sessions used only %v", seen)
	}
	// Without the header, the first message is the key.
	sys := `{"model": "qwen", "messages": [{"role": "system", "content": "you are helpful"}, {"role": "user", "content": "%d"}]}`
	resp, _ := tf.post(fmt.Sprintf(sys, 0))
	want := resp.Header.Get("X-Fleet-Host")
	for i := 1; i < 5; i++ {
		if resp, _ := tf.post(fmt.Sprintf(sys, i)); resp.Header.Get("X-Fleet-Host") != want {
			t.Fatalf("a shared system prompt moved from %s to %s", want, resp.Header.Get("X-Fleet-Host"))
		}
	}
}

func TestModelsAndStatus(t *testing.T) {
	a := newFakeHost(t, "a", []statusapi.Pool{readyPool("gpu0", "qwen", 0)},
		hostModel{ID: "chat", Root: "qwen", State: "ready"}, hostModel{ID: "qwen", Root: "qwen", State: "ready"})
	b := newFakeHost(t, "b", []statusapi.Pool{emptyPool("gpu0")},
		hostModel{ID: "qwen", Root: "qwen", State: "available", Pools: []string{"gpu0"}}, hostModel{ID: "bge", Root: "bge", State: "available"})
	tf := startFleet(t, Options{}, HandlerOptions{Version: "v9"}, a, b)
	resp, err := http.Get(tf.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []statusapi.FleetModel `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	got := make(map[string]statusapi.FleetModel)
	for _, e := range list.Data {
		got[e.ID] = e
	}
	if len(got) != 3 || got["qwen"].State != "ready" || len(got["qwen"].Hosts) != 2 || got["qwen"].Hosts[1].Pools[0] != "gpu0" ||
		got["chat"].Root != "qwen" || got["bge"].State != "available" || got["bge"].Hosts[0].Name != "b" {
		t.Fatalf("models: %+v", list.Data)
	}

	resp, err = http.Get(tf.srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var st statusapi.Fleetd
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.Version != "v9" || len(st.Hosts) != 2 || st.Hosts[0].Name != "a" || !st.Hosts[0].Healthy || st.Hosts[0].Version != "test" ||
		len(st.Hosts[0].Pools) != 1 || *st.Hosts[0].Pools[0].Profile != "qwen" || st.Hosts[1].Source != "file" {
		t.Fatalf("status: %+v", st)
	}
}

// The hosts file is reloaded when the watcher says so: a valid file changes
// the membership, a bad one changes nothing and is reported.
func TestWatchFile(t *testing.T) {
	a := newFakeHost(t, "a", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("chat", "qwen"), model("qwen", "qwen"))
	b := newFakeHost(t, "b", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	path := filepath.Join(t.TempDir(), "hosts.json")
	write := func(hosts ...*fakeHost) {
		var f File
		for _, h := range hosts {
			f.Hosts = append(f.Hosts, h.spec())
		}
		data, _ := json.Marshal(f)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(a)
	tf := startFleet(t, Options{}, HandlerOptions{})
	if err := tf.fleet.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	tf.waitHost("a", "healthy", func(s statusapi.Host) bool { return s.Healthy })
	changes := make(chan struct{})
	done := make(chan struct{})
	go func() { tf.fleet.WatchFile(path, changes); close(done) }()
	defer func() { close(changes); <-done }()

	write(b)
	changes <- struct{}{}
	tf.waitHost("b", "healthy", func(s statusapi.Host) bool { return s.Healthy })
	waitFor(t, "a removed", func() bool { hosts, _ := tf.fleet.Status(); return len(hosts) == 1 })

	if err := os.WriteFile(path, []byte(`{"hosts": [{"name": "c"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	changes <- struct{}{}
	waitFor(t, "the error reported", func() bool { _, fs := tf.fleet.Status(); return fs.LastError != nil })
	hosts, fs := tf.fleet.Status()
	if len(hosts) != 1 || hosts[0].Name != "b" || !strings.Contains(*fs.LastError, `hosts[0] "c": url: required`) || fs.Path != path {
		t.Fatalf("after a bad file: %+v %+v", hosts, fs)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// fakeResolver answers from its maps.
type fakeResolver struct {
	mu    sync.Mutex // guards the fields below
	ips   map[string][]net.IPAddr
	srv   map[string][]*net.SRV
	calls int // SRV lookups
}

func (r *fakeResolver) LookupIPAddr(ctx context.Context, name string) ([]net.IPAddr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ips, ok := r.ips[name]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

func (r *fakeResolver) LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if service != "" || proto != "" {
		return "", nil, errors.New("the record name must be passed whole")
	}
	if srv, ok := r.srv[name]; ok {
		return name, srv, nil
	}
	return "", nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

func TestResolve(t *testing.T) {
	r := &fakeResolver{
		ips: map[string][]net.IPAddr{"poold.consul": {{IP: net.ParseIP("10.0.0.2")}, {IP: net.ParseIP("fd00::1")}, {IP: net.ParseIP("10.0.0.2")}}},
		srv: map[string][]*net.SRV{"_poold._tcp.svc": {{Target: "b.svc.", Port: 8080}, {Target: "a.svc.", Port: 9090}}},
	}
	got, err := resolve(context.Background(), r, DNSSpec{Name: "poold.consul", Type: "a", Port: 8080, Scheme: "http", Weight: 2})
	if err != nil || len(got) != 2 || got[0].Name != "10.0.0.2:8080" || got[0].URL != "http://10.0.0.2:8080" ||
		got[1].URL != "http://[fd00::1]:8080" || got[1].Weight != 2 {
		t.Fatalf("a: %+v %v", got, err)
	}
	got, err = resolve(context.Background(), r, DNSSpec{Name: "_poold._tcp.svc", Type: "srv", Scheme: "https"})
	if err != nil || len(got) != 2 || got[0].Name != "a.svc:9090" || got[0].URL != "https://a.svc:9090" || got[1].Name != "b.svc:8080" {
		t.Fatalf("srv: %+v %v", got, err)
	}
	if _, err := resolve(context.Background(), r, DNSSpec{Name: "gone", Type: "srv"}); err == nil || !strings.Contains(err.Error(), `resolving SRV "gone"`) {
		t.Fatalf("missing name: %v", err)
	}
}

// Hosts found in DNS join the fleet, follow the records as they change, and
// stay when a lookup fails.
func TestDNSDiscovery(t *testing.T) {
	a := newFakeHost(t, "a", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("chat", "qwen"), model("qwen", "qwen"))
	b := newFakeHost(t, "b", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	addr := func(fh *fakeHost) *net.SRV {
		host, port, _ := net.SplitHostPort(strings.TrimPrefix(fh.srv.URL, "http://"))
		var p uint16
		fmt.Sscan(port, &p)
		return &net.SRV{Target: host + ".", Port: p}
	}
	r := &fakeResolver{srv: map[string][]*net.SRV{"_poold._tcp.test": {addr(a)}}}
	tf := startFleet(t, Options{Resolver: r}, HandlerOptions{})
	d := DNSSpec{Name: "_poold._tcp.test", Type: "srv", Scheme: "http", Weight: 1, interval: 5 * time.Millisecond}
	tf.fleet.Apply(&File{DNS: []DNSSpec{d}})
	nameA := strings.TrimPrefix(a.srv.URL, "http://")
	nameB := strings.TrimPrefix(b.srv.URL, "http://")
	st := tf.waitHost(nameA, "found and healthy", func(s statusapi.Host) bool { return s.Healthy })
	if st.Source != "dns:_poold._tcp.test" {
		t.Fatalf("source %q", st.Source)
	}
	r.mu.Lock()
	r.srv["_poold._tcp.test"] = []*net.SRV{addr(b)}
	r.mu.Unlock()
	tf.waitHost(nameB, "found and healthy", func(s statusapi.Host) bool { return s.Healthy })
	waitFor(t, "a gone", func() bool { hosts, _ := tf.fleet.Status(); return len(hosts) == 1 })

	r.mu.Lock()
	delete(r.srv, "_poold._tcp.test")
	before := r.calls
	r.mu.Unlock()
	waitFor(t, "three failed lookups", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.calls >= before+3 })
	if hosts, _ := tf.fleet.Status(); len(hosts) != 1 || hosts[0].Name != nameB {
		t.Fatalf("a failed lookup changed the fleet: %+v", hosts)
	}

	// A file without the DNS name drops its hosts.
	tf.fleet.Apply(&File{Hosts: []HostSpec{a.spec()}})
	tf.waitHost("a", "healthy", func(s statusapi.Host) bool { return s.Healthy })
	waitFor(t, "dns hosts gone", func() bool { hosts, _ := tf.fleet.Status(); return len(hosts) == 1 })
}

// A client that leaves mid-stream cancels the request at the host, and the
// fleet's own count of requests in flight there drops back.
func TestClientGoneCancelsHost(t *testing.T) {
	cancelled := make(chan struct{})
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	h.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			close(cancelled)
		}
	})
	tf := startFleet(t, Options{}, HandlerOptions{}, h)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tf.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model": "qwen", "stream": true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	hs := tf.fleet.snapshot()["h"]
	inFlight := func() int {
		hs.mu.Lock()
		defer hs.mu.Unlock()
		return hs.local["qwen"]
	}
	if n := inFlight(); n != 1 {
		t.Fatalf("local in flight = %d", n)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the host's request was not cancelled")
	}
	waitFor(t, "local count back to zero", func() bool { return inFlight() == 0 })
}

// A hosts-file reload that changes a host's weight and labels while requests
// and polls use the host is no data race (run with -race).
func TestReloadWeightDuringRequests(t *testing.T) {
	a := newFakeHost(t, "a", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("chat", "qwen"), model("qwen", "qwen"))
	tf := startFleet(t, Options{}, HandlerOptions{}, a)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 40 {
			if resp, body := tf.post(chat); resp.StatusCode != http.StatusOK {
				t.Errorf("%d %s", resp.StatusCode, body)
				return
			}
		}
	}()
	i := 0
	for reloading := true; reloading; i++ {
		select {
		case <-done:
			reloading = false
		default:
		}
		spec := a.spec()
		spec.Weight = 1 + i%3
		spec.Labels = map[string]string{"round": strconv.Itoa(i)}
		tf.fleet.Apply(&File{Hosts: []HostSpec{spec}})
		tf.fleet.Status()
	}
	last := i - 1
	st := tf.waitHost("a", "reloaded", func(s statusapi.Host) bool { return s.Labels["round"] == strconv.Itoa(last) })
	if st.Weight != 1+last%3 {
		t.Fatalf("weight %d after the last reload", st.Weight)
	}
}

// A host that read the whole request and then dropped the connection may
// have done the work: the request is not sent to another host (no replay),
// the client gets a 502.
func TestNoRetryOfARequestAHostRead(t *testing.T) {
	dropper := newFakeHost(t, "dropper", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	other := newFakeHost(t, "other", []statusapi.Pool{readyPool("gpu0", "qwen", 5)}, model("qwen", "qwen"))
	dropper.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body) // read it all, then go away
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}
	})
	tf := startFleet(t, Options{PollInterval: time.Hour}, HandlerOptions{}, dropper, other)
	resp, body := tf.post(`{"model": "qwen"}`)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Fleet-Host") != "dropper" {
		t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("X-Fleet-Host"), body)
	}
	if n := other.postCount(); n != 0 {
		t.Fatalf("the request was sent again to another host (%d times)", n)
	}
}
