package tenant_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/tenant"
)

const gateFile = `{
  "tiers": {"shared": {"weight": 1}},
  "tenants": [
    {"name": "team-a", "keys": ["` + "%A%" + `"], "tier": "shared", "rpm": 2, "tpm": 100, "maxOutputTokens": 50},
    {"name": "team-b", "keys": ["` + "%B%" + `"], "tier": "shared"}
  ]
}`

func gate(t *testing.T) *tenant.Gate {
	t.Helper()
	c, err := tenant.Parse([]byte(strings.NewReplacer("%A%", tenant.HashKey("key-a"), "%B%", tenant.HashKey("key-b")).Replace(gateFile)))
	if err != nil {
		t.Fatal(err)
	}
	return tenant.NewGate(c, nil)
}

// errorOf decodes an OpenAI error answer.
func errorOf(t *testing.T, rec *httptest.ResponseRecorder) (typ, code, param, msg string) {
	t.Helper()
	var e struct {
		Error struct {
			Message, Type string
			Param         *string
			Code          string
		}
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("not an OpenAI error: %q", rec.Body)
	}
	if e.Error.Param != nil {
		param = *e.Error.Param
	}
	return e.Error.Type, e.Error.Code, param, e.Error.Message
}

// post is a request to path, for the gate's answers to it; chat is one to
// the chat route.
func post(path string) *http.Request { return httptest.NewRequest(http.MethodPost, path, nil) }

var chat = post("/v1/chat/completions")

// anthropicError decodes an error answer in Anthropic's shape, {"type":
// "error", "error": {"type", "message", "code"}}, failing on any other.
func anthropicError(t *testing.T, rec *httptest.ResponseRecorder) (typ, code, msg string) {
	t.Helper()
	var e struct {
		Type  string
		Error map[string]string
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Type != "error" || len(e.Error) != 3 || e.Error["type"] == "" || e.Error["message"] == "" {
		t.Fatalf("not an Anthropic error: %q", rec.Body)
	}
	return e.Error["type"], e.Error["code"], e.Error["message"]
}

// On the Messages route, plain or pinned, the gate's refusals are in
// Anthropic's shape, with their status and headers: the 401 of an unknown
// key, the 429s of rpm and of a worst case past tpm (with Retry-After),
// and the 400 of a bound past the cap.
func TestRefusalsOnMessagesRoute(t *testing.T) {
	for _, path := range []string{"/v1/messages", "/pools/gpu0/v1/messages"} {
		g := gate(t) // team-a: rpm 2, tpm 100, maxOutputTokens 50
		a := g.Config().Tenant("team-a")
		r := post(path)

		rec := httptest.NewRecorder()
		g.Require(http.NotFoundHandler()).ServeHTTP(rec, r)
		if typ, code, _ := anthropicError(t, rec); rec.Code != 401 || typ != "authentication_error" || code != "invalid_api_key" || rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%s without a key: %d %s %v", path, rec.Code, rec.Body, rec.Header())
		}

		for range 2 {
			g.Admit(httptest.NewRecorder(), r, a)
		}
		rec = httptest.NewRecorder()
		if g.Admit(rec, r, a) {
			t.Fatalf("%s: a third request at rpm 2 was admitted", path)
		}
		if typ, code, msg := anthropicError(t, rec); rec.Code != 429 || typ != "rate_limit_error" || code != "rate_limit_exceeded" ||
			rec.Header().Get("Retry-After") == "" || rec.Header().Get("x-ratelimit-remaining-requests") != "0" || !strings.Contains(msg, "RPM") {
			t.Errorf("%s past rpm: %d %s %v", path, rec.Code, rec.Body, rec.Header())
		}

		g.Reserve(httptest.NewRecorder(), r, a, 70)
		rec = httptest.NewRecorder()
		if g.Reserve(rec, r, a, 40) {
			t.Fatalf("%s: 40 more of the 30 tokens left were reserved", path)
		}
		if typ, code, msg := anthropicError(t, rec); rec.Code != 429 || typ != "rate_limit_error" || code != "rate_limit_exceeded" ||
			rec.Header().Get("Retry-After") == "" || !strings.Contains(msg, "up to 40 tokens") {
			t.Errorf("%s past tpm: %d %s %v", path, rec.Code, rec.Body, rec.Header())
		}

		_, req, _ := readBody(t, `{"model":"m","max_tokens":51,"messages":[]}`)
		rec = httptest.NewRecorder()
		if _, ok := g.Cap(rec, r, a, "/v1/messages", req); ok {
			t.Fatalf("%s: max_tokens 51 passed a cap of 50", path)
		}
		if typ, code, msg := anthropicError(t, rec); rec.Code != 400 || typ != "invalid_request_error" || code != "output_cap_exceeded" || !strings.Contains(msg, "max_tokens") {
			t.Errorf("%s past the cap: %d %s", path, rec.Code, rec.Body)
		}
	}
}

// Without a known key: 401 on the API, never on the operations endpoints;
// with one, the handler finds the tenant in the request's context.
func TestRequire(t *testing.T) {
	g := gate(t)
	var seen *tenant.Tenant
	h := g.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = tenant.FromContext(r.Context()) }))
	for _, tc := range []struct {
		path, key string
		status    int
		tenant    string
	}{
		{"/v1/chat/completions", "", 401, ""},
		{"/v1/models", "wrong", 401, ""},
		{"/v1/models", "key-b", 200, "team-b"},
		{"/v1/chat/completions", "key-a", 200, "team-a"},
		{"/health", "", 200, ""},
		{"/metrics", "", 200, ""},
		{"/usage", "the-admin-token", 200, ""}, // its own auth decides: no tenant here
	} {
		seen = nil
		r := httptest.NewRequest("GET", tc.path, nil)
		if tc.key != "" {
			r.Header.Set("Authorization", "Bearer "+tc.key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != tc.status {
			t.Fatalf("%s with %q: %d, want %d", tc.path, tc.key, rec.Code, tc.status)
		}
		if tc.status == 401 {
			if _, code, _, _ := errorOf(t, rec); code != "invalid_api_key" {
				t.Fatalf("401 code %q", code)
			}
			continue
		}
		if got := ""; seen != nil {
			got = seen.Name
			if got != tc.tenant {
				t.Fatalf("%s with %q: tenant %q, want %q", tc.path, tc.key, got, tc.tenant)
			}
		} else if tc.tenant != "" {
			t.Fatalf("%s with %q: no tenant", tc.path, tc.key)
		}
	}
	var none *tenant.Gate
	if none.Require(h) == nil || none.Config() != nil {
		t.Fatal("a nil gate")
	}
}

// Every admitted answer carries the six headers; past rpm, a 429 of type
// requests with Retry-After; after a debit past tpm, one of type tokens.
func TestAdmit(t *testing.T) {
	g := gate(t)
	a := g.Config().Tenant("team-a")
	for i := range 2 {
		rec := httptest.NewRecorder()
		if !g.Admit(rec, chat, a) {
			t.Fatalf("request %d refused", i)
		}
		for _, h := range []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
			"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
			if rec.Header().Get(h) == "" {
				t.Fatalf("request %d lacks %s: %v", i, h, rec.Header())
			}
		}
		if got := rec.Header().Get("x-ratelimit-remaining-requests"); got != []string{"1", "0"}[i] {
			t.Fatalf("request %d: remaining %s", i, got)
		}
	}
	rec := httptest.NewRecorder()
	if g.Admit(rec, chat, a) {
		t.Fatal("a third request at rpm 2 was admitted")
	}
	typ, code, _, msg := errorOf(t, rec)
	if rec.Code != 429 || typ != "requests" || code != "rate_limit_exceeded" || rec.Header().Get("Retry-After") == "" || !strings.Contains(msg, "RPM") {
		t.Fatalf("429: %d %s %s %q %v", rec.Code, typ, code, msg, rec.Header())
	}

	b := g.Config().Tenant("team-b") // no limits: no headers
	rec = httptest.NewRecorder()
	if !g.Admit(rec, chat, b) || rec.Header().Get("x-ratelimit-limit-requests") != "" {
		t.Fatalf("a tenant without limits: %v", rec.Header())
	}

	g2 := gate(t)
	a = g2.Config().Tenant("team-a")
	g2.Settle(a, 0, 150)
	rec = httptest.NewRecorder()
	if g2.Admit(rec, chat, a) {
		t.Fatal("a tenant in token debt was admitted")
	}
	if typ, _, _, msg := errorOf(t, rec); typ != "tokens" || !strings.Contains(msg, "TPM") {
		t.Fatalf("tpm refusal: %s %q", typ, msg)
	}
}

// A worst case the token bucket holds is reserved, and the headers say what
// is left; one it does not hold gets a 429 naming the limit and the worst
// case; the unused part comes back when the request settles. A nil gate or
// tenant reserves nothing.
func TestReserve(t *testing.T) {
	g := gate(t) // team-a: tpm 100
	a := g.Config().Tenant("team-a")
	rec := httptest.NewRecorder()
	if !g.Reserve(rec, chat, a, 70) || rec.Header().Get("x-ratelimit-remaining-tokens") != "30" || rec.Header().Get("x-ratelimit-limit-tokens") != "100" {
		t.Fatalf("70 of 100: %d %v", rec.Code, rec.Header())
	}
	rec = httptest.NewRecorder()
	if g.Reserve(rec, chat, a, 40) {
		t.Fatal("40 more of the 30 left were reserved")
	}
	typ, code, _, msg := errorOf(t, rec)
	if rec.Code != 429 || typ != "tokens" || code != "rate_limit_exceeded" || rec.Header().Get("Retry-After") == "" ||
		!strings.Contains(msg, "TPM") || !strings.Contains(msg, "limit 100") || !strings.Contains(msg, "up to 40 tokens") {
		t.Fatalf("refused: %d %s %s %q %v", rec.Code, typ, code, msg, rec.Header())
	}
	g.Settle(a, 70, 20) // 50 back: 80 left
	rec = httptest.NewRecorder()
	if !g.Reserve(rec, chat, a, 40) || rec.Header().Get("x-ratelimit-remaining-tokens") != "40" {
		t.Fatalf("after the refund: %d %v", rec.Code, rec.Header())
	}

	b := g.Config().Tenant("team-b") // no limits
	var none *tenant.Gate
	for _, ok := range []bool{g.Reserve(httptest.NewRecorder(), chat, b, 1<<20), g.Reserve(httptest.NewRecorder(), chat, nil, 1<<20), none.Reserve(httptest.NewRecorder(), chat, a, 1<<20)} {
		if !ok {
			t.Fatal("a tenant without tpm, no tenant or no gate refused")
		}
	}
	g.Settle(b, 0, 1<<20)
	g.Settle(nil, 0, 1<<20)
	none.Settle(a, 0, 1<<20)
}

// A request's worst case is its prompt's estimate plus its largest output
// bound on its route (else the default given, else DefaultOutputBound)
// times its choices; routes that generate nothing have no output bound.
func TestWorstCase(t *testing.T) {
	for _, tc := range []struct {
		path, body string
		dflt, want int
	}{
		{"/v1/chat/completions", `{"model":"m","max_tokens":50}`, 0, 8 + 50},
		{"/v1/chat/completions", `{"model":"m","max_tokens":50,"max_completion_tokens":70}`, 0, 14 + 70},
		{"/v1/chat/completions", `{"model":"m","max_tokens":null}`, 100, 8 + 100},
		{"/v1/chat/completions", `{"model":"m"}`, 0, 4 + tenant.DefaultOutputBound},
		{"/v1/completions", `{"model":"m","max_tokens":10,"n":3}`, 0, 9 + 30},
		{"/v1/completions", `{"model":"m","max_tokens":10,"n":2,"best_of":5}`, 0, 12 + 50},
		{"/v1/completions", `{"model":"m","max_tokens":10,"n":"4"}`, 0, 10 + 40},
		{"/v1/chat/completions", `{"model":"m","max_tokens":1e300,"n":1e300}`, 0, 1 << 30},
		{"/v1/chat/completions", `{"model":"m","n":3}`, 100, 5 + 300},
		{"/v1/chat/completions", `{"model":"m","max_output_tokens":7}`, 100, 9 + 100}, // not the route's: the engine ignores it
		{"/v1/embeddings", `{"model":"m","input":"some text here"}`, 0, 10},
	} {
		body, req, status := readBody(t, tc.body)
		if status != 0 {
			t.Fatalf("%s: read %d", tc.body, status)
		}
		if got := tenant.WorstCase(tc.path, body, req, nil, tc.dflt); got != tc.want {
			t.Errorf("%s %s: worst case %d, want %d", tc.path, tc.body, got, tc.want)
		}
	}
}

// A bound over the cap is refused naming it; no bound gets the cap in the
// field the route reads; routes that generate nothing are left alone.
func TestCap(t *testing.T) {
	g := gate(t)
	a := g.Config().Tenant("team-a")
	for _, tc := range []struct {
		path, body string
		status     int
		want       string // the body sent on, or the param refused
	}{
		{"/v1/chat/completions", `{"model":"m","max_tokens":51}`, 400, "max_tokens"},
		{"/v1/chat/completions", `{"model":"m","max_completion_tokens":"500"}`, 400, "max_completion_tokens"},
		{"/v1/chat/completions", `{"model":"m","max_tokens":"lots"}`, 400, "max_tokens"},
		{"/v1/chat/completions", `{"model":"m","max_tokens":50}`, 0, `{"model":"m","max_tokens":50}`},
		// An explicit null is no bound: the cap applies, and the body keeps
		// exactly one bound, the cap (the engine keeps a duplicate's last).
		{"/v1/chat/completions", `{"model":"m","max_tokens":null}`, 0, `{"max_completion_tokens":50,"model":"m"}`},
		{"/v1/chat/completions", `{"max_completion_tokens":null,"model":"m"}`, 0, `{"max_completion_tokens":50,"model":"m"}`},
		{"/v1/chat/completions", `{"model":"m","max_tokens":40,"max_completion_tokens":30}`, 0, `{"max_completion_tokens":30,"model":"m"}`},
		{"/v1/completions", `{"model":"m"}`, 0, `{"max_tokens":50,"model":"m"}`},
		{"/v1/responses", `{"model":"m","max_tokens":10}`, 0, `{"max_output_tokens":50,"model":"m"}`},
		{"/v1/responses", `{"model":"m","max_output_tokens":null}`, 0, `{"max_output_tokens":50,"model":"m"}`},
		{"/v1/embeddings", `{"model":"m","max_tokens":5000}`, 0, `{"model":"m","max_tokens":5000}`},
		// The cap bounds the request, not each sequence: n and best_of
		// multiply the bound.
		{"/v1/chat/completions", `{"model":"m","n":3,"max_tokens":20}`, 400, "max_tokens"},
		{"/v1/chat/completions", `{"model":"m","n":2,"max_tokens":25}`, 0, `{"model":"m","n":2,"max_tokens":25}`},
		{"/v1/chat/completions", `{"model":"m","n":3}`, 0, `{"max_completion_tokens":16,"model":"m","n":3}`},
		{"/v1/completions", `{"model":"m","n":1,"best_of":5}`, 0, `{"max_tokens":10,"model":"m","n":1,"best_of":5}`},
		{"/v1/chat/completions", `{"model":"m","n":3000,"max_tokens":50}`, 400, "n"},
		{"/v1/chat/completions", `{"model":"m","n":0}`, 400, "n"},
		{"/v1/completions", `{"model":"m","best_of":"x"}`, 400, "best_of"},
		{"/v1/chat/completions", `{"model":"m","n":null}`, 0, `{"max_completion_tokens":50,"model":"m","n":null}`},
	} {
		body, req, status := readBody(t, tc.body)
		if status != 0 {
			t.Fatalf("%s: read %d", tc.body, status)
		}
		rec := httptest.NewRecorder()
		bound, ok := g.Cap(rec, post(tc.path), a, tc.path, req)
		if tc.status != 0 {
			_, _, param, msg := errorOf(t, rec)
			if ok || rec.Code != tc.status || param != tc.want || !strings.Contains(msg, "50") {
				t.Fatalf("%s %s: ok %v, %d param %q %q", tc.path, tc.body, ok, rec.Code, param, msg)
			}
			continue
		}
		if out := openai.Rewrite(body, req, openai.Changes{Bound: bound}); !ok || string(out) != tc.want {
			t.Fatalf("%s %s: ok %v, sent %s, want %s", tc.path, tc.body, ok, out, tc.want)
		}
	}
	b := g.Config().Tenant("team-b")
	_, req, _ := readBody(t, `{"model":"m","max_tokens":100000}`)
	if bound, ok := g.Cap(httptest.NewRecorder(), chat, b, "/v1/chat/completions", req); !ok || bound != nil {
		t.Fatal("a tenant without a cap was capped")
	}
}

func readBody(t *testing.T, s string) ([]byte, openai.Request, int) {
	t.Helper()
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(s))
	return openai.ReadRequest(httptest.NewRecorder(), r, 1<<20)
}
