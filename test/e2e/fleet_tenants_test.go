package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poold/poold/internal/rdb/rdbtest"
	"github.com/poold/poold/internal/statusapi"
)

// team is a tenant of the fleet tests, whose key is "key-NAME".
func team(name string, rpm, tpm int) tenantSpec {
	return tenantSpec{Name: name, Key: "key-" + name, RPM: rpm, TPM: tpm}
}

// missingRateHeaders lists the rate-limit headers h lacks.
func missingRateHeaders(h http.Header) []string {
	var out []string
	for _, k := range rateHeaders {
		if h.Get(k) == "" {
			out = append(out, k)
		}
	}
	return out
}

// send posts body to path on fleetd as tenant name's key ("" for none) and
// returns the answer with its body read.
func (f *fleetd) send(ctx context.Context, path, name, body string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+path, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if name != "" {
		req.Header.Set("Authorization", "Bearer key-"+name)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// status is fleetd's /status.
func (f *fleetd) status() statusapi.Fleetd {
	f.t.Helper()
	resp, err := http.Get(f.url + "/status")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st statusapi.Fleetd
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		f.t.Fatal(err)
	}
	return st
}

// checkHostSaw stops h, which writes out its access log, and fails the test
// unless h logged every request of seen and none of unseen (fleetd's request
// ids, which it forwards). It returns the number of requests h logged.
func checkHostSaw(t *testing.T, h *daemon, seen, unseen []string) int {
	t.Helper()
	h.stop()
	log := h.stdout.String()
	for _, id := range seen {
		if !strings.Contains(log, `"request_id":"`+id+`"`) {
			t.Errorf("request %s, forwarded, is not in the host's access log", id)
		}
	}
	for _, id := range unseen {
		if strings.Contains(log, `"request_id":"`+id+`"`) {
			t.Errorf("request %s, refused by fleetd, reached the host", id)
		}
	}
	return strings.Count(log, `"msg":"request"`)
}

// Two fleetd replicas share a tenant's limits in one real Redis: of 100
// requests at once split across them, a tenant at 60 a minute gets 60 (one
// or two more if a second or two passed while they arrived) and the rest
// 429 with Retry-After; every answer carries the six x-ratelimit-*
// headers. Another tenant, sending at the same time, is not refused.
func TestFleetTenantsSharedLimits(t *testing.T) {
	url := rdbtest.Start(t)
	hosts := hostsWithA(t, 1, nil)
	tenants := writeTenants(t, tenantsJSON(team("team-a", 60, 10_000_000), team("team-b", 100_000, 10_000_000)))
	replicas := []*fleetd{
		startFleetd(t, hosts, "--redis-url", url, "--tenants", tenants, "--redis-timeout", "10s"),
		startFleetd(t, hosts, "--redis-url", url, "--tenants", tenants, "--redis-timeout", "10s"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var mu sync.Mutex // guards the figures below
	admitted, refused, bOK := 0, 0, 0
	var lastAnswer time.Time
	var problems []string
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 120 {
		name := "team-a"
		if i >= 100 {
			name = "team-b"
		}
		wg.Go(func() {
			<-release
			resp, body, err := replicas[i%2].send(ctx, "/v1/chat/completions", name, fmt.Sprintf(shortChat, "a"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				problems = append(problems, err.Error())
				return
			}
			if missing := missingRateHeaders(resp.Header); len(missing) > 0 {
				problems = append(problems, fmt.Sprintf("%s: %d without %v", name, resp.StatusCode, missing))
			}
			switch {
			case name == "team-b" && resp.StatusCode == http.StatusOK:
				bOK++
			case name == "team-b":
				problems = append(problems, fmt.Sprintf("team-b: %d %s", resp.StatusCode, body))
			case resp.StatusCode == http.StatusOK:
				admitted++
			case resp.StatusCode == http.StatusTooManyRequests:
				refused++
				lastAnswer = time.Now()
				if e := apiError(t, body); e.Error.Code != "rate_limit_exceeded" || !strings.Contains(e.Error.Message, "requests per minute") ||
					resp.Header.Get("Retry-After") == "" || resp.Header.Get("x-ratelimit-remaining-requests") != "0" {
					problems = append(problems, fmt.Sprintf("a 429: %v %s", resp.Header, body))
				}
			default:
				problems = append(problems, fmt.Sprintf("team-a: %d %s", resp.StatusCode, body))
			}
		})
	}
	start := time.Now()
	close(release)
	wg.Wait()
	// A second's worth (one request) refills each second: the bound grows
	// with the time the refusals took to arrive.
	most := 62 + int(lastAnswer.Sub(start).Seconds())
	t.Logf("team-a: %d admitted, %d refused (the last refusal %v after the start); team-b: %d of 20 served",
		admitted, refused, lastAnswer.Sub(start).Round(time.Millisecond), bOK)
	if len(problems) > 0 {
		t.Fatalf("%d problems, the first: %s", len(problems), problems[0])
	}
	if admitted < 60 || admitted > most || admitted+refused != 100 || bOK != 20 {
		t.Fatalf("team-a: %d admitted, %d refused, want 60 to %d admitted; team-b: %d of 20", admitted, refused, most, bOK)
	}
	limited := 0.0
	for _, f := range replicas {
		limited += metricSum(t, f.url, "fleetd_tenant_requests_total", `tenant="team-a"`, `code="429"`)
	}
	if int(limited) != refused {
		t.Fatalf("fleetd_tenant_requests_total{code=429} sums to %v, want %d", limited, refused)
	}
}

// With Redis stopped, fleetd lets requests through unchecked (fail-open),
// warns once and counts each; with --redis-fail-closed it refuses them
// with 429. When Redis is back, the limits hold again, and fleetd says so
// once.
func TestFleetTenantsRedisDown(t *testing.T) {
	srv := rdbtest.Run(t)
	hosts := hostsWithA(t, 1, nil)
	tenants := writeTenants(t, tenantsJSON(team("team-a", 6000, 10_000_000)))
	open := startFleetd(t, hosts, "--redis-url", srv.URL, "--tenants", tenants, "--redis-timeout", "10s")
	closed := startFleetd(t, hosts, "--redis-url", srv.URL, "--tenants", tenants, "--redis-timeout", "10s", "--redis-fail-closed")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	post := func(f *fleetd) (*http.Response, []byte) {
		t.Helper()
		resp, body, err := f.send(ctx, "/v1/chat/completions", "team-a", fmt.Sprintf(shortChat, "a"))
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	for _, f := range []*fleetd{open, closed} {
		if resp, body := post(f); resp.StatusCode != http.StatusOK || len(missingRateHeaders(resp.Header)) > 0 {
			t.Fatalf("with Redis: %d %v %s", resp.StatusCode, resp.Header, body)
		}
	}

	srv.Stop()
	const n = 10
	var through []string
	for range n {
		resp, body := post(open)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("fail-open without Redis: %d %s", resp.StatusCode, body)
		}
		through = append(through, resp.Header.Get("X-Request-Id"))
	}
	resp, body := post(closed)
	if e := apiError(t, body); resp.StatusCode != http.StatusTooManyRequests || e.Error.Code != "rate_limit_exceeded" ||
		resp.Header.Get("Retry-After") == "" || !strings.Contains(e.Error.Message, "could not be checked") {
		t.Fatalf("fail-closed without Redis: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	refusedID := resp.Header.Get("X-Request-Id")
	if v := metricSum(t, open.url, "fleetd_tenant_limits_unchecked_total", `step="admit"`); v != n {
		t.Fatalf("fleetd_tenant_limits_unchecked_total{step=admit} = %v, want %d", v, n)
	}
	const down, up = "tenant limits cannot be checked: the shared store is unreachable", "tenant limits are checked again"
	if c := strings.Count(open.stderr.String(), down); c != 1 || !strings.Contains(open.stderr.String(), "fail-open") {
		t.Fatalf("the outage warned %d times, want once (fail-open)", c)
	}
	if !strings.Contains(closed.stderr.String(), "fail-closed") {
		t.Fatal("fail-closed fleetd did not warn of the outage")
	}
	if st := open.status(); st.TenantLimits == nil || st.TenantLimits.Reachable || st.TenantLimits.Store != "redis" {
		t.Fatalf("/status during the outage: %+v", st.TenantLimits)
	}

	srv.Start()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, _ := post(open); resp.Header.Get("x-ratelimit-limit-requests") == "6000" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the limits were not checked again within 30s of Redis's return")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c := strings.Count(open.stderr.String(), up); c != 1 || strings.Count(open.stderr.String(), down) != 1 {
		t.Fatalf("Redis's return logged %d times, want once; the outage %d times", c, strings.Count(open.stderr.String(), down))
	}
	if st := open.status(); !st.TenantLimits.Reachable {
		t.Fatal("/status: still unreachable")
	}
	// The requests let through unchecked reached the host, the one refused
	// did not.
	checkHostSaw(t, hosts[0], through, []string{refusedID})
}

// fleetd applies a tenant's models, output cap and tokens per minute (the
// reservation of a request's worst case) before any host sees the request: the host's access log does not move for what
// fleetd refuses. A model outside the tenant's patterns is answered as one
// that does not exist, and /v1/models lists only the tenant's.
func TestFleetTenantsBeforeHosts(t *testing.T) {
	tag := t.Name()
	h := startPoold(t, tag, hostProfiles(tag, "a", []string{"a", "b"}))
	h.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	a := team("team-a", 0, 60)
	a.MaxOutputTokens, a.Models = 5, []string{"a"}
	f := startFleetd(t, []*daemon{h}, "--tenants", writeTenants(t, tenantsJSON(a)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	send := func(body string) (*http.Response, []byte) {
		t.Helper()
		resp, b, err := f.send(ctx, "/v1/chat/completions", "team-a", body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	var forwarded, refusedIDs []string // fleetd's request ids
	refused := func(what, body string, status int, code string) apiErr {
		t.Helper()
		resp, b := send(body)
		e := apiError(t, b)
		if resp.StatusCode != status || e.Error.Code != code {
			t.Fatalf("%s: %d %s, want %d %s", what, resp.StatusCode, b, status, code)
		}
		refusedIDs = append(refusedIDs, resp.Header.Get("X-Request-Id"))
		return e
	}

	if resp, _, err := f.send(ctx, "/v1/chat/completions", "", fmt.Sprintf(shortChat, "a")); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a key: %v %v", resp, err)
	}
	hidden := refused("a model of another tenant", fmt.Sprintf(shortChat, "b"), 404, "model_not_found")
	unknown := refused("a model that does not exist", fmt.Sprintf(shortChat, "zzz"), 404, "model_not_found")
	if strings.Replace(hidden.Error.Message, `"b"`, `"zzz"`, 1) != unknown.Error.Message || !strings.HasSuffix(unknown.Error.Message, "available models: a") {
		t.Fatalf("the 404s differ: %q and %q", hidden.Error.Message, unknown.Error.Message)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer key-team-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list statusapi.ModelList[statusapi.FleetModel]
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || len(list.Data) != 1 || list.Data[0].ID != "a" {
		t.Fatalf("the tenant's /v1/models: %+v %v", list, err)
	}
	e := refused("above the output cap", `{"model": "a", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}`, 400, "output_cap_exceeded")
	if e.Error.Param == nil || *e.Error.Param != "max_tokens" || !strings.Contains(e.Error.Message, "cap of 5") {
		t.Fatalf("the 400 does not name the cap: %+v", e)
	}

	// No bound: the cap is the bound. The tokens used are debited.
	resp, body := send(`{"model": "a", "messages": [{"role": "user", "content": "hi"}]}`)
	var answer struct {
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || resp.StatusCode != http.StatusOK || answer.Usage.CompletionTokens != 5 {
		t.Fatalf("without max_tokens: %d %s", resp.StatusCode, body)
	}
	forwarded = append(forwarded, resp.Header.Get("X-Request-Id"))
	if lim := resp.Header.Get("x-ratelimit-limit-tokens"); lim != "60" {
		t.Fatalf("x-ratelimit-limit-tokens %q", lim)
	}
	// A stream that did not ask for usage gets none, and is debited.
	tokens := metricSum(t, f.url, "fleetd_tenant_tokens_total", `tenant="team-a"`)
	resp, body = send(`{"model": "a", "stream": true, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}`)
	if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "prompt_tokens") || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream: %d %s", resp.StatusCode, body)
	}
	forwarded = append(forwarded, resp.Header.Get("X-Request-Id"))
	if after := metricSum(t, f.url, "fleetd_tenant_tokens_total", `tenant="team-a"`); after < tokens+3 {
		t.Fatalf("the stream debited %v tokens", after-tokens)
	}

	// 60 tokens a minute: a request with a long prompt, whose worst case
	// (its prompt's estimate and max_tokens, 76) is above the limit, is
	// taken only from a full bucket; the requests above took some of it, so
	// it is refused on its reservation, naming its worst case.
	long := fmt.Sprintf(`{"model": "a", "max_tokens": 1, "messages": [{"role": "user", "content": %q}]}`, strings.Repeat("many words ", 20))
	resp, body = send(long)
	if e := apiError(t, body); resp.StatusCode != http.StatusTooManyRequests || e.Error.Code != "rate_limit_exceeded" || !strings.Contains(e.Error.Message, "tokens per minute") ||
		!strings.Contains(e.Error.Message, "may use up to 76 tokens") || resp.Header.Get("Retry-After") == "" || resp.Header.Get("x-ratelimit-remaining-tokens") == "60" {
		t.Fatalf("a worst case above the limit, the bucket not full: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	refusedIDs = append(refusedIDs, resp.Header.Get("X-Request-Id"))
	for code, want := range map[string]float64{"404": 2, "400": 1, "429": 1} {
		if v := metricSum(t, f.url, "fleetd_tenant_requests_total", `tenant="team-a"`, `code="`+code+`"`); v != want {
			t.Errorf("fleetd_tenant_requests_total{code=%s} = %v, want %v", code, v, want)
		}
	}
	if n := checkHostSaw(t, h, forwarded, refusedIDs); n != len(forwarded) {
		t.Errorf("the host logged %d requests, want the %d fleetd forwarded", n, len(forwarded))
	}
}

// A tenants file reload changes the limits of the requests that follow and
// leaves those in flight alone; a bad file is refused and reported, and the
// last good one stays in force. fleetd refuses to start on a bad file, with
// every problem, and with both api-keys and tenants.
func TestFleetTenantsReload(t *testing.T) {
	hosts := hostsWithA(t, 1, nil)
	path := writeTenants(t, tenantsJSON(team("team-a", 2, 0)))
	f := startFleetd(t, hosts, "--tenants", path)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	post := func(want int, limit string) {
		t.Helper()
		resp, body, err := f.send(ctx, "/v1/chat/completions", "team-a", fmt.Sprintf(shortChat, "a"))
		if err != nil || resp.StatusCode != want || resp.Header.Get("x-ratelimit-limit-requests") != limit {
			t.Fatalf("want %d with limit %s: %v %v %s", want, limit, err, resp, body)
		}
	}

	// A stream of about 3 s (150 tokens, 20 ms apart) is in flight through
	// the reloads.
	stream, rd := f.openStream(ctx, "a", 150, "Authorization", "Bearer key-team-a")
	defer stream.Body.Close()
	post(200, "2")
	post(429, "2")

	first := f.status().TenantsFile
	writeFile(t, path, tenantsJSON(team("team-a", 100, 0)))
	var st statusapi.Fleetd
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st = f.status(); st.TenantsFile.SHA256 != first.SHA256 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new tenants file was not in force within 20s")
		}
	}
	post(200, "100")

	writeFile(t, path, []byte(`{"tiers": {"shared": {"weight": 0}}, "tenants": [{"name": "team-a", "tier": "gold", "keys": []}]}`))
	for deadline := time.Now().Add(20 * time.Second); f.status().TenantsFile.LastError == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the bad tenants file was not reported within 20s")
		}
	}
	bad := f.status().TenantsFile
	for _, want := range []string{"tiers.shared: weight: must be at least 1", `tenants[0] "team-a": tier "gold": no such tier`, "keys: at least one key is required"} {
		if !strings.Contains(*bad.LastError, want) {
			t.Errorf("lastError lacks %q: %s", want, *bad.LastError)
		}
	}
	if bad.SHA256 != st.TenantsFile.SHA256 || metricSum(t, f.url, "fleetd_tenants_file_last_reload_successful") != 0 ||
		!strings.Contains(f.stderr.String(), "tenants file refused; keeping the tenants in force") {
		t.Fatalf("the refusal: %+v, gauge %v", bad, metricSum(t, f.url, "fleetd_tenants_file_last_reload_successful"))
	}
	post(200, "100")

	rest, err := io.ReadAll(rd)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Contains(string(rest), `"error"`) {
		t.Fatalf("the stream in flight: %v, ends %q", err, tail(string(rest), 3))
	}

	// At start, a bad file or tenants with api-keys stop fleetd.
	hostsFile := filepath.Join(t.TempDir(), "hosts.json")
	writeFile(t, hostsFile, []byte(`{"hosts": [{"name": "h", "url": "http://127.0.0.1:1"}]}`))
	code, _, stderr := runCLI(t, nil, fleetdBin, "--listen", freeAddr(t), "--hosts", hostsFile, "--tenants", path)
	if code != 1 || !strings.Contains(stderr, "loading tenants") || !strings.Contains(stderr, "no such tier") || !strings.Contains(stderr, "weight: must be at least 1") {
		t.Fatalf("a bad tenants file at start: exit %d\n%s", code, stderr)
	}
	keys := filepath.Join(t.TempDir(), "keys")
	writeFile(t, keys, []byte("sk-a\n"))
	code, _, stderr = runCLI(t, nil, fleetdBin, "--hosts", hostsFile, "--tenants", path, "--api-keys-file", keys)
	if code != 2 || !strings.Contains(stderr, "tenants: not with api-keys") {
		t.Fatalf("tenants with api-keys: exit %d\n%s", code, stderr)
	}
}
