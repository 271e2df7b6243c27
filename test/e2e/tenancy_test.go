package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// tenantSpec is one tenant of a test's tenants file; Tier is "shared"
// (weight 1) when empty.
type tenantSpec struct {
	Name, Key, Tier string
	RPM, TPM        int
	MaxOutputTokens int
	Models          []string
	Pools           []string
}

// tenantsJSON renders a tenants file with the tiers reserved (weight 10),
// shared (1) and batch (1, background).
func tenantsJSON(specs ...tenantSpec) []byte {
	var ts []map[string]any
	for _, s := range specs {
		sum := sha256.Sum256([]byte(s.Key))
		m := map[string]any{"name": s.Name, "keys": []string{"sha256:" + hex.EncodeToString(sum[:])}, "tier": s.Tier}
		if s.Tier == "" {
			m["tier"] = "shared"
		}
		for k, v := range map[string]int{"rpm": s.RPM, "tpm": s.TPM, "maxOutputTokens": s.MaxOutputTokens} {
			if v != 0 {
				m[k] = v
			}
		}
		if s.Models != nil {
			m["models"] = s.Models
		}
		if s.Pools != nil {
			m["pools"] = s.Pools
		}
		ts = append(ts, m)
	}
	b, _ := json.MarshalIndent(map[string]any{
		"tiers":   map[string]any{"reserved": map[string]any{"weight": 10}, "shared": map[string]any{"weight": 1}, "batch": map[string]any{"weight": 1, "background": true}},
		"tenants": ts,
	}, "", "  ")
	return b
}

// writeTenants writes a tenants file for --tenants and returns its path.
func writeTenants(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// rateHeaders are OpenAI's six x-ratelimit-* headers.
var rateHeaders = []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
	"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"}

// oneModel is a profiles file with one pool and the simulator profiles ids,
// each with extra (may be nil) and the first loaded at start.
func oneModel(tag string, extra map[string]any, ids ...string) []byte {
	var sims []sim
	for _, id := range ids {
		sims = append(sims, sim{ID: id, Extra: extra})
	}
	return profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: ids[0]}}, sims, nil)
}

// errorCode is the code (and type) of an OpenAI error body.
func errorCode(t *testing.T, body []byte) (code, typ, message string) {
	t.Helper()
	var e struct {
		Error struct{ Code, Type, Message string }
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("not an OpenAI error: %s", body)
	}
	return e.Error.Code, e.Error.Type, e.Error.Message
}

// A tenant at rpm 60 sending 100 requests at once gets 60 answers (61 if a
// second passes) and 429s for the rest, each with Retry-After and the six
// headers; another tenant is unaffected; tpm is enforced on the tokens
// reported; the refusals are counted per tenant.
func TestTenantLimits(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, oneModel(tag, nil, "m"), "--tenants", writeTenants(t, tenantsJSON(
		tenantSpec{Name: "team-a", Key: "sk-a", RPM: 60, TPM: 1_000_000},
		tenantSpec{Name: "team-b", Key: "sk-b", RPM: 60, TPM: 1_000_000},
		tenantSpec{Name: "team-c", Key: "sk-c", TPM: 100},
	)))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx := t.Context()

	var mu sync.Mutex
	byStatus := map[int]int{}
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			code, h, body := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", false, 1), bearer("sk-a"))
			for _, name := range rateHeaders {
				if h.Get(name) == "" {
					t.Errorf("a %d answer lacks %s", code, name)
				}
			}
			if code == http.StatusTooManyRequests {
				c, typ, msg := errorCode(t, body)
				if c != "rate_limit_exceeded" || typ != "requests" || !strings.Contains(msg, "RPM") || h.Get("Retry-After") == "" {
					t.Errorf("429: %s %s %q, Retry-After %q", c, typ, msg, h.Get("Retry-After"))
				}
			}
			mu.Lock()
			byStatus[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("team-a, 100 requests at once at rpm 60: %v", byStatus)
	if byStatus[200] < 60 || byStatus[200] > 61 || byStatus[200]+byStatus[429] != 100 {
		t.Fatalf("by status %v; want 60 (or 61) answers and the rest 429", byStatus)
	}
	if code, h, body := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", false, 1), bearer("sk-b")); code != http.StatusOK || h.Get("x-ratelimit-remaining-requests") != "59" {
		t.Fatalf("team-b after team-a's burst: %d %s, remaining %q", code, body, h.Get("x-ratelimit-remaining-requests"))
	}

	// tpm 100: a request of up to 150 completion tokens, a worst case above
	// the limit, is taken from the full bucket, which it puts in debt; the
	// next is refused on tokens.
	if code, _, body := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", true, 150), bearer("sk-c")); code != http.StatusOK {
		t.Fatalf("team-c's first: %d %s", code, body)
	}
	code, h, body := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", false, 1), bearer("sk-c"))
	if c, typ, _ := errorCode(t, body); code != http.StatusTooManyRequests || c != "rate_limit_exceeded" || typ != "tokens" || h.Get("Retry-After") == "" {
		t.Fatalf("team-c in token debt: %d %s", code, body)
	}
	if h.Get("x-ratelimit-remaining-tokens") != "0" || h.Get("x-ratelimit-limit-tokens") != "100" {
		t.Fatalf("team-c's token headers: %v", h)
	}

	// The refusals are counted per tenant, as rate_limited.
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := d.metricValue(`poold_requests_total{client="team-a",code_class="4xx",outcome="rate_limited",pool="none",profile="none",stream="false"}`)
		c := d.metricValue(`poold_requests_total{client="team-c",code_class="4xx",outcome="rate_limited",pool="none",profile="none",stream="false"}`)
		if a == float64(byStatus[429]) && c == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rate_limited requests counted: team-a %v (want %d), team-c %v (want 1)", a, byStatus[429], c)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A tenant sees only its models: another model is "not found" (in
// /v1/models too), exactly as one that does not exist; its output cap
// refuses more and is inserted when nothing is asked, and a capped stream
// ends whole; without a known key, 401.
func TestTenantModelsAndCaps(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "qwen-7b"}},
		[]sim{{ID: "qwen-7b", Aliases: []string{"chat"}}, {ID: "llama-8b"}}, nil),
		"--tenants", writeTenants(t, tenantsJSON(
			tenantSpec{Name: "team-a", Key: "sk-a", Models: []string{"qwen*"}, MaxOutputTokens: 8},
			tenantSpec{Name: "team-b", Key: "sk-b"},
		)))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx := t.Context()
	chat := func(key, body string) (int, []byte) {
		code, _, b := sendTo(ctx, t, d.url+"/v1/chat/completions", body, bearer(key))
		return code, b
	}

	hidden, hiddenBody := chat("sk-a", chatBody("llama-8b", false, 1))
	missing, missingBody := chat("sk-a", chatBody("no-such-model", false, 1))
	hc, _, hm := errorCode(t, hiddenBody)
	mc, _, mm := errorCode(t, missingBody)
	// The same answer, but for the name asked for: nothing tells them apart.
	same := strings.ReplaceAll(hm, "llama-8b", "X") == strings.ReplaceAll(mm, "no-such-model", "X")
	if hidden != http.StatusNotFound || missing != http.StatusNotFound || hc != "model_not_found" || mc != "model_not_found" || !same {
		t.Fatalf("team-a asking for llama-8b: %d %s; for no-such-model: %d %s", hidden, hiddenBody, missing, missingBody)
	}
	if code, body := chat("sk-a", chatBody("chat", false, 1)); code != http.StatusOK {
		t.Fatalf("team-a asking for its model by an alias: %d %s", code, body)
	}
	models := func(key string) []string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct{ Data []struct{ ID string } }
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range l.Data {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if a, b := strings.Join(models("sk-a"), ","), strings.Join(models("sk-b"), ","); a != "chat,qwen-7b" || b != "chat,llama-8b,qwen-7b" {
		t.Fatalf("/v1/models: team-a %s, team-b %s", a, b)
	}

	// The cap: more is refused, naming it; nothing asked gets the cap, and
	// the stream ends with its usage, not cut.
	code, body := chat("sk-a", chatBody("qwen-7b", true, 9))
	if c, _, msg := errorCode(t, body); code != http.StatusBadRequest || c != "output_cap_exceeded" || !strings.Contains(msg, "8") {
		t.Fatalf("max_tokens 9 over a cap of 8: %d %s", code, body)
	}
	code, body = chat("sk-a", `{"model":"qwen-7b","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	if _, completion := usageOf(t, body, true); code != http.StatusOK || completion != 8 || !strings.Contains(string(body), `"finish_reason":"length"`) || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("a stream asking for nothing under a cap of 8: %d %s", code, body)
	}
	if code, body := chat("sk-b", chatBody("qwen-7b", false, 40)); code != http.StatusOK {
		t.Fatalf("team-b has no cap: %d %s", code, body)
	}
	if code, body := chat("sk-nobody", chatBody("qwen-7b", false, 1)); code != http.StatusUnauthorized {
		t.Fatalf("an unknown key: %d %s", code, body)
	}
}

// A reload of the tenants file changes limits at once, without touching a
// request in flight; a bad file is refused, reported, and the tenants in
// force stay.
func TestTenantsReload(t *testing.T) {
	tag := t.Name()
	file := writeTenants(t, tenantsJSON(tenantSpec{Name: "team-a", Key: "sk-a", RPM: 2}))
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "20ms"}}}, nil), "--tenants", file)
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx := t.Context()

	// A long stream in flight across both reloads.
	type answer struct {
		code int
		body []byte
	}
	long := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("m", true, 100)))
		req.Header.Set("Authorization", "Bearer sk-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			long <- answer{0, []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		long <- answer{resp.StatusCode, b}
	}()
	d.waitPool("p0", 10*time.Second, "the long stream in flight", func(p poolView) bool { return p.InFlight == 1 })
	if code, _, body := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", false, 1), bearer("sk-a")); code != http.StatusOK {
		t.Fatalf("second request: %d %s", code, body)
	}
	if code, _, _ := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", false, 1), bearer("sk-a")); code != http.StatusTooManyRequests {
		t.Fatalf("third request at rpm 2: %d", code)
	}

	writeFile(t, file, tenantsJSON(tenantSpec{Name: "team-a", Key: "sk-a", RPM: 1000}))
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, h, _ := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", false, 1), bearer("sk-a"))
		if code == http.StatusOK && h.Get("x-ratelimit-limit-requests") == "1000" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rpm 1000 not in force within 20 s: %d %v", code, h)
		}
		time.Sleep(20 * time.Millisecond)
	}

	writeFile(t, file, []byte(`{"tiers": {"shared": {"weight": 1}}, "tenants": [{"name": "team-a", "keys": ["sk-in-clear"], "tier": "gold"}]}`))
	deadline = time.Now().Add(20 * time.Second)
	for d.metricValue("poold_tenants_last_reload_successful") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the bad tenants file was not refused within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var st struct {
		Tenants *struct {
			LastError *string `json:"lastError"`
		} `json:"tenants"`
	}
	resp, err := http.Get(d.url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Tenants == nil || st.Tenants.LastError == nil || !strings.Contains(*st.Tenants.LastError, `tier "gold"`) {
		t.Fatalf("/status tenants after a bad file: %+v %v", st.Tenants, err)
	}
	if !strings.Contains(d.stderr.String(), "tenants reload refused") || strings.Contains(d.stderr.String(), "sk-in-clear") {
		t.Fatal("the refusal is not logged, or the log shows a key")
	}
	if code, h, body := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", false, 1), bearer("sk-a")); code != http.StatusOK || h.Get("x-ratelimit-limit-requests") != "1000" {
		t.Fatalf("after the bad file, the tenants in force: %d %s", code, body)
	}

	a := <-long
	if a.code != http.StatusOK || !strings.Contains(string(a.body), "[DONE]") {
		t.Fatalf("the stream in flight across the reloads: %d %s", a.code, tail(string(a.body), 3))
	}
	checkStream(t, a.body, "m", 100)
}
