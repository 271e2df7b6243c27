package fleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poold/poold/internal/rdb"
	"github.com/poold/poold/internal/rdb/rdbtest"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
)

// tenantsFile writes a tenants file of one tier whose tenants are given as
// JSON objects without keys: each gets the key "key-NAME".
func tenantsFile(t *testing.T, path string, tenants ...string) {
	t.Helper()
	var list []string
	for _, ten := range tenants {
		var v struct{ Name string }
		if err := json.Unmarshal([]byte(ten), &v); err != nil {
			t.Fatal(err)
		}
		list = append(list, fmt.Sprintf(`{"keys": [%q], "tier": "shared", %s`, tenant.HashKey("key-"+v.Name), ten[1:]))
	}
	data := `{"tiers": {"shared": {"weight": 1}}, "tenants": [` + strings.Join(list, ", ") + `]}`
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startTenantFleet runs a fleet over hosts behind the tenants file at path,
// with limits kept by opts.Limiter (nil: in memory).
func startTenantFleet(t *testing.T, path string, opts TenantsOptions, hosts ...*fakeHost) (*testFleet, *Tenants) {
	t.Helper()
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	ts, err := LoadTenants(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	return startFleet(t, Options{Metrics: opts.Metrics}, HandlerOptions{Tenants: ts}, hosts...), ts
}

// apiErr decodes an OpenAI error body.
func apiErr(t *testing.T, body string) (code, msg string) {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an OpenAI error: %q", body)
	}
	return e.Error.Code, e.Error.Message
}

// With a tenants file, fleetd refuses before any host is asked: no key
// (401), the rate limit (429), a model outside the tenant's patterns (404,
// as if it did not exist), an output bound above the cap (400). What
// passes goes to the host with the client's key and the cap added, and
// every answer past the key carries fleetd's x-ratelimit-* headers, not the
// host's.
func TestTenantsEnforcedBeforeHosts(t *testing.T) {
	var mu sync.Mutex // guards bodies
	var bodies []string
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("chat", "qwen"), model("qwen", "qwen"), model("bge", "bge"))
	h.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			bodies = append(bodies, string(b))
			mu.Unlock()
			w.Header().Set("X-Ratelimit-Limit-Requests", "999") // the host's own, from its own buckets
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"ok": true}`)
		}
	})
	path := filepath.Join(t.TempDir(), "tenants.json")
	tenantsFile(t, path, `{"name": "team-a", "rpm": 6, "maxOutputTokens": 50, "models": ["chat"]}`, `{"name": "team-b"}`)
	tf, _ := startTenantFleet(t, path, TenantsOptions{}, h)
	const a, b = "Bearer key-team-a", "Bearer key-team-b"
	chatTo := func(model, extra string) string {
		return fmt.Sprintf(`{"model": %q, %s"messages": [{"role": "user", "content": "hi"}]}`, model, extra)
	}

	for _, tc := range []struct {
		what, body, key string
		status          int
		code            string
	}{
		{"no key", chatTo("chat", ""), "", 401, "invalid_api_key"},
		{"an unknown key", chatTo("chat", ""), "Bearer key-team-z", 401, "invalid_api_key"},
		{"a model outside the patterns", chatTo("bge", ""), a, 404, "model_not_found"},
		{"its canonical id, outside too", chatTo("qwen", ""), a, 404, "model_not_found"},
		{"a model that does not exist", chatTo("nope", ""), a, 404, "model_not_found"},
		{"above the cap", chatTo("chat", `"max_tokens": 51, `), a, 400, "output_cap_exceeded"},
	} {
		resp, body := tf.post(tc.body, "Authorization", tc.key)
		code, msg := apiErr(t, body)
		if resp.StatusCode != tc.status || code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.what, resp.StatusCode, body, tc.status, tc.code)
		}
		if tc.status == 404 && !strings.HasSuffix(msg, "does not exist on any host; available models: chat") {
			t.Errorf("%s: the 404 is not the one of a model that does not exist, listing only the tenant's: %s", tc.what, msg)
		}
		want := "6" // every answer past the key
		if tc.status == 401 {
			want = ""
		}
		if resp.Header.Get("X-Ratelimit-Limit-Requests") != want {
			t.Errorf("%s: x-ratelimit-limit-requests %q, want %q", tc.what, resp.Header.Get("X-Ratelimit-Limit-Requests"), want)
		}
	}
	if n := h.postCount(); n != 0 {
		t.Fatalf("the host got %d refused requests", n)
	}

	// Six requests a minute, four taken by the refusals: two go, with the
	// cap added to the one that set none; the next is refused.
	for i, extra := range []string{"", `"max_tokens": 50, `} {
		resp, body := tf.post(chatTo("chat", extra), "Authorization", a)
		if limit := resp.Header.Values("X-Ratelimit-Limit-Requests"); resp.StatusCode != 200 || len(limit) != 1 || limit[0] != "6" ||
			resp.Header.Get("X-Ratelimit-Remaining-Requests") != fmt.Sprint(1-i) || resp.Header.Get("X-Ratelimit-Reset-Requests") == "" {
			t.Fatalf("request %d: %d %v %s", i, resp.StatusCode, resp.Header, body)
		}
	}
	resp, body := tf.post(chatTo("chat", ""), "Authorization", a)
	if code, msg := apiErr(t, body); resp.StatusCode != 429 || code != "rate_limit_exceeded" || resp.Header.Get("Retry-After") == "" ||
		resp.Header.Get("X-Ratelimit-Remaining-Requests") != "0" || !strings.Contains(msg, "requests per minute") {
		t.Fatalf("past the limit: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := h.postCount(); n != 2 {
		t.Fatalf("the host got %d requests, want the 2 admitted", n)
	}
	mu.Lock()
	if !strings.HasPrefix(bodies[0], `{"max_completion_tokens":50,`) || strings.Contains(bodies[1], "max_completion_tokens") {
		t.Errorf("bodies at the host: %q", bodies)
	}
	mu.Unlock()
	h.set(func(fh *fakeHost) {
		if len(fh.auth) != 2 || fh.auth[0] != a {
			t.Errorf("Authorization at the host: %q", fh.auth)
		}
	})

	// Another tenant is unaffected, and has no limits to report.
	for range 5 {
		if resp, body := tf.post(chatTo("bge", ""), "Authorization", b); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Requests") != "999" {
			t.Fatalf("team-b: %d %v %s", resp.StatusCode, resp.Header, body)
		}
	}

	// The model list is the tenant's.
	for key, want := range map[string][]string{a: {"chat"}, b: {"bge", "chat", "qwen"}} {
		req, _ := http.NewRequest(http.MethodGet, tf.srv.URL+"/v1/models", nil)
		req.Header.Set("Authorization", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var list statusapi.ModelList[statusapi.FleetModel]
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		var got []string
		for _, m := range list.Data {
			got = append(got, m.ID)
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("models of %s: %v, want %v (%v)", key, got, want, err)
		}
	}

	// So is GET /v1/models/{id}: another tenant's model is a 404 like one
	// that does not exist; unknown routes and methods are OpenAI-shaped too.
	for _, c := range []struct {
		key, path string
		status    int
	}{{a, "/v1/models/chat", 200}, {a, "/v1/models/qwen", 404}, {b, "/v1/models/qwen", 200}, {a, "/v1/nope", 405}, {a, "/nope", 404}, {"", "/v1/models/chat", 401}} {
		req, _ := http.NewRequest(http.MethodGet, tf.srv.URL+c.path, nil)
		if c.key != "" {
			req.Header.Set("Authorization", c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("GET %s as %q: %d %s, want %d", c.path, c.key, resp.StatusCode, body, c.status)
		}
		if c.status == 404 && !strings.Contains(string(body), `available models: chat"`) && !strings.Contains(string(body), "unknown_route") {
			t.Errorf("GET %s as %q: the 404 %s names other models", c.path, c.key, body)
		}
	}

	m := tf.fleet.metrics
	for code, want := range map[string]float64{"200": 2, "404": 3, "400": 1, "429": 1} {
		if got := testutil.ToFloat64(m.tenantRequests.WithLabelValues("team-a", code)); got != want {
			t.Errorf("fleetd_tenant_requests_total{tenant=team-a,code=%s} = %v, want %v", code, got, want)
		}
	}
	if got := testutil.ToFloat64(m.tenantRequests.WithLabelValues("team-b", "200")); got != 5 {
		t.Errorf("team-b's requests: %v", got)
	}
}

// Each request's worst case is reserved, and settled when its answer ends
// with the usage the host reported: tokens used beyond the reservation are
// taken, and a tenant in debt is refused on its tokens per minute. A stream
// that did not ask for usage is asked for it, and the usage chunk is
// withheld from the client; one cut short is billed its prompt's estimate
// and the chunks it got.
func TestTenantTokensDebited(t *testing.T) {
	var mu sync.Mutex // guards the fields below
	var streamBody string
	cut := make(chan struct{})
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	h.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if !bytes.Contains(b, []byte(`"stream": true`)) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id": "x", "usage": {"prompt_tokens": 30, "completion_tokens": 40, "total_tokens": 70}, "choices": []}`)
				return
			}
			mu.Lock()
			streamBody = string(b)
			mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			for range 3 {
				io.WriteString(w, "data: {\"choices\": [{\"delta\": {\"content\": \"x\"}}], \"usage\": null}\n\n")
			}
			if bytes.Contains(b, []byte(`"cut"`)) {
				w.(http.Flusher).Flush()
				<-cut
				panic(http.ErrAbortHandler)
			}
			io.WriteString(w, "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 3, \"total_tokens\": 8}}\n\ndata: [DONE]\n\n")
		}
	})
	path := filepath.Join(t.TempDir(), "tenants.json")
	tenantsFile(t, path, `{"name": "team-a", "tpm": 100}`)
	tf, _ := startTenantFleet(t, path, TenantsOptions{}, h)
	key := []string{"Authorization", "Bearer key-team-a"}
	tokens := func(kind string) float64 {
		return testutil.ToFloat64(tf.fleet.metrics.tenantTokens.WithLabelValues("team-a", kind))
	}

	// A stream: the client sees no usage chunk, fleetd counts it.
	resp, body := tf.post(`{"model": "qwen", "stream": true, "max_tokens": 5, "messages": []}`, key...)
	mu.Lock()
	asked := streamBody
	mu.Unlock()
	if resp.StatusCode != 200 || strings.Contains(body, "usage\": {") || !strings.HasSuffix(body, "data: [DONE]\n\n") ||
		!strings.Contains(asked, `"stream_options":{"include_usage":true}`) {
		t.Fatalf("stream: %d %s; the host was sent %s", resp.StatusCode, body, asked)
	}
	if tokens("prompt") != 5 || tokens("completion") != 3 {
		t.Fatalf("tokens after the stream: %v prompt, %v completion", tokens("prompt"), tokens("completion"))
	}

	// A stream the host cuts: the three chunks the client got.
	req, _ := http.NewRequest(http.MethodPost, tf.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model": "qwen", "stream": true, "max_tokens": 5, "user": "cut"}`))
	req.Header.Set(key[0], key[1])
	cresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(cresp.Body)
	for range 3 {
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	close(cut)
	io.Copy(io.Discard, rd)
	cresp.Body.Close()
	// Its prompt too: it was made whatever the client got, 27 tokens for
	// the 105 bytes the host was sent (stream_options added).
	waitFor(t, "the cut stream's chunks and prompt debited", func() bool { return tokens("completion") == 6 && tokens("prompt") == 5+27 })

	// 100 a minute: 8 and 30 taken; a request whose worst case is 14 (33
	// bytes, 5 tokens of output) uses 70 and puts the tenant in debt, and
	// the next request is refused.
	if resp, body := tf.post(`{"model": "qwen", "max_tokens": 5}`, key...); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Tokens") != "100" {
		t.Fatalf("a request of 14: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	resp, body = tf.post(`{"model": "qwen", "max_tokens": 5}`, key...)
	if code, msg := apiErr(t, body); resp.StatusCode != 429 || code != "rate_limit_exceeded" || !strings.Contains(msg, "tokens per minute") ||
		resp.Header.Get("X-Ratelimit-Remaining-Tokens") != "0" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("in debt: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := h.postCount(); n != 3 {
		t.Fatalf("the host got %d requests, want 3", n)
	}
}

// A reload changes the limits of the requests that follow; a file that
// does not load changes nothing, and says so in /status, the metric and
// the log, until it is fixed.
func TestTenantsReload(t *testing.T) {
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	path := filepath.Join(t.TempDir(), "tenants.json")
	tenantsFile(t, path, `{"name": "team-a", "rpm": 1}`)
	var logs lockedLog
	tf, ts := startTenantFleet(t, path, TenantsOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, h)
	key := []string{"Authorization", "Bearer key-team-a"}
	status := func() statusapi.Fleetd {
		resp, err := http.Get(tf.srv.URL + "/status")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st statusapi.Fleetd
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	first := status()
	if first.TenantsFile == nil || first.TenantsFile.Path != path || first.TenantsFile.SHA256 == "" || first.TenantLimits == nil ||
		!reflect.DeepEqual(*first.TenantLimits, statusapi.TenantLimits{Store: "memory", Reachable: true}) {
		t.Fatalf("status: %+v %+v", first.TenantsFile, first.TenantLimits)
	}
	if resp, _ := tf.post(`{"model": "qwen"}`, key...); resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	if resp, _ := tf.post(`{"model": "qwen"}`, key...); resp.StatusCode != 429 {
		t.Fatalf("second request at 1 a minute: %d", resp.StatusCode)
	}

	tenantsFile(t, path, `{"name": "team-a", "rpm": 5}`)
	if err := ts.Reload(); err != nil {
		t.Fatal(err)
	}
	if resp, _ := tf.post(`{"model": "qwen"}`, key...); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Requests") != "5" {
		t.Fatalf("after the reload: %d %v", resp.StatusCode, resp.Header)
	}
	second := status().TenantsFile
	if !strings.Contains(logs.String(), `msg="tenants file reloaded"`) || !strings.Contains(logs.String(), "changed=[team-a]") {
		t.Fatalf("the reload is not logged with what changed:\n%s", logs.String())
	}

	if err := os.WriteFile(path, []byte(`{"tiers": {"shared": {"weight": 1}}, "tenants": [{"name": "team-a", "tier": "gold"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	changes := make(chan struct{})
	done := make(chan struct{})
	go func() { ts.Watch(changes); close(done) }()
	defer func() { close(changes); <-done }()
	changes <- struct{}{}
	waitFor(t, "the refusal in /status", func() bool { return status().TenantsFile.LastError != nil })
	st := status()
	if !strings.Contains(*st.TenantsFile.LastError, `tenants[0] "team-a": tier "gold": no such tier`) ||
		!strings.Contains(*st.TenantsFile.LastError, `keys: at least one key is required`) || st.TenantsFile.SHA256 != second.SHA256 || second.SHA256 == first.TenantsFile.SHA256 {
		t.Fatalf("after a bad file: %+v", st.TenantsFile)
	}
	if v := testutil.ToFloat64(tf.fleet.metrics.tenantsReload.WithLabelValues()); v != 0 {
		t.Fatalf("reload gauge %v after a bad file", v)
	}
	if !strings.Contains(logs.String(), "tenants file refused; keeping the tenants in force") {
		t.Fatalf("no refusal in the log:\n%s", logs.String())
	}
	if resp, _ := tf.post(`{"model": "qwen"}`, key...); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Requests") != "5" {
		t.Fatalf("the last good file is not in force: %d %v", resp.StatusCode, resp.Header)
	}

	tenantsFile(t, path, `{"name": "team-a", "rpm": 5}`) // the file in force again
	changes <- struct{}{}
	waitFor(t, "the recovery in /status", func() bool { return status().TenantsFile.LastError == nil })
	if v := testutil.ToFloat64(tf.fleet.metrics.tenantsReload.WithLabelValues()); v != 1 || !strings.Contains(logs.String(), "tenants file valid again") {
		t.Fatalf("after the fix: gauge %v\n%s", v, logs.String())
	}
}

// lockedLog is a log destination safe for concurrent writes.
type lockedLog struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// With the limits in Redis, an outage lets requests through unchecked
// (fail-open): each is counted, the outage is logged once, and once more
// when it ends. Fail-closed refuses them with 429.
func TestTenantLimitsOutage(t *testing.T) {
	srv := rdbtest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A short breaker backoff: the outage trips it, and Redis's return is
	// found within waitFor's bound.
	rc, err := rdb.Open(ctx, srv.URL, rdb.Options{Prefix: "test:", BreakerBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	path := filepath.Join(t.TempDir(), "tenants.json")
	tenantsFile(t, path, `{"name": "team-a", "rpm": 1000, "tpm": 100000}`)
	limits := rc.Limits()
	limits.Timeout = 10 * time.Second // a busy machine must not time a check out
	var logs lockedLog
	tf, ts := startTenantFleet(t, path, TenantsOptions{Limiter: limits, Shared: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, h)
	limits.OnError, limits.OnReserveError, limits.OnSettleError, limits.OnRecover = ts.Unchecked, ts.ReserveUnchecked, ts.SettleLost, ts.Recovered
	key := []string{"Authorization", "Bearer key-team-a"}
	m := tf.fleet.metrics
	post := func(want int) {
		t.Helper()
		if resp, body := tf.post(`{"model": "qwen"}`, key...); resp.StatusCode != want {
			t.Fatalf("%d %s, want %d", resp.StatusCode, body, want)
		}
	}
	post(200)

	srv.Stop()
	for range 5 {
		post(200)
	}
	if a, r := testutil.ToFloat64(m.unchecked.WithLabelValues("admit")), testutil.ToFloat64(m.unchecked.WithLabelValues("reserve")); a != 5 || r != 5 {
		t.Fatalf("%v unchecked admissions and %v reservations counted, want 5 each", a, r)
	}
	const down, up = "tenant limits cannot be checked: the shared store is unreachable", "tenant limits are checked again"
	if n := strings.Count(logs.String(), down); n != 1 || !strings.Contains(logs.String(), "fail-open") {
		t.Fatalf("the outage logged %d times, want once:\n%s", n, logs.String())
	}
	if _, limits := ts.Status(); limits.Store != "redis" || limits.Reachable || limits.FailClosed {
		t.Fatalf("status during the outage: %+v", limits)
	}

	srv.Start()
	waitFor(t, "Redis back", func() bool {
		resp, _ := tf.post(`{"model": "qwen"}`, key...)
		return resp.Header.Get("X-Ratelimit-Limit-Requests") == "1000"
	})
	post(200)
	if n := strings.Count(logs.String(), up); n != 1 || strings.Count(logs.String(), down) != 1 {
		t.Fatalf("the end of the outage logged %d times, want once:\n%s", n, logs.String())
	}
	if _, limits := ts.Status(); !limits.Reachable {
		t.Fatal("status: still unreachable")
	}

	// Fail-closed: refused while Redis is down.
	closed := rc.Limits()
	closed.FailClosed, closed.Timeout = true, 10*time.Second
	var closedLogs lockedLog
	tf, ts = startTenantFleet(t, path, TenantsOptions{Limiter: closed, Shared: true, FailClosed: true, Logger: slog.New(slog.NewTextHandler(&closedLogs, nil))}, h)
	closed.OnError = ts.Unchecked
	post(200)
	srv.Stop()
	resp, body := tf.post(`{"model": "qwen"}`, key...)
	if code, msg := apiErr(t, body); resp.StatusCode != 429 || code != "rate_limit_exceeded" || resp.Header.Get("Retry-After") == "" || !strings.Contains(msg, "could not be checked") {
		t.Fatalf("fail-closed during an outage: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if !strings.Contains(closedLogs.String(), "fail-closed") || testutil.ToFloat64(tf.fleet.metrics.unchecked.WithLabelValues("admit")) != 1 {
		t.Fatalf("fail-closed outage not reported:\n%s", closedLogs.String())
	}
}

// fleetd passes keep_alive through to the host, which acts on it: also when
// it rewrites the body for a tenant's output cap.
func TestKeepAlivePassesThrough(t *testing.T) {
	var mu sync.Mutex // guards bodies
	var bodies []string
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("chat", "qwen"))
	h.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			bodies = append(bodies, string(b))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"ok": true}`)
		}
	})
	path := filepath.Join(t.TempDir(), "tenants.json")
	tenantsFile(t, path, `{"name": "team-a", "maxOutputTokens": 50}`)
	tf, _ := startTenantFleet(t, path, TenantsOptions{}, h)
	for _, body := range []string{
		`{"model": "chat", "keep_alive": "10m", "messages": [{"role": "user", "content": "hi"}]}`,
		`{"model": "chat", "keep_alive": 0, "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}`,
	} {
		if resp, got := tf.post(body, "Authorization", "Bearer key-team-a"); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || !strings.Contains(bodies[0], `"keep_alive": "10m"`) || !strings.Contains(bodies[1], `"keep_alive": 0`) ||
		!strings.Contains(bodies[0], `"max_completion_tokens":50`) {
		t.Fatalf("bodies at the host: %q, want each keep_alive kept and the cap added", bodies)
	}
}
