package pipeline

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/tenant"
)

// The Router sends every inference POST to the API as its path came, never
// cleaned or redirected by the mux; another method on an inference route
// is a 405 naming POST; the rest is the mux's, in poold's shape.
func TestRouter(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "models") })
	rt := &Router{
		Mux:   mux,
		API:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "api "+r.URL.Path) }),
		IsAPI: func(path string) bool { return strings.HasPrefix(path, "/v1/") },
		Route: func(u *url.URL) bool { return u.Path == "/v1/chat/completions" },
	}
	for _, c := range []struct {
		method, path string
		code         int
		body, allow  string
	}{
		{"POST", "/v1/chat/completions", 200, "api /v1/chat/completions", ""},
		{"POST", "/v1//chat/completions", 200, "api /v1//chat/completions", ""}, // a mux would redirect it
		{"POST", "/v1/models", 200, "api /v1/models", ""},
		{"GET", "/v1/chat/completions", 405, `"method_not_allowed"`, "POST"},
		{"GET", "/v1/models", 200, "models", ""},
		{"GET", "/nowhere", 404, `"unknown_route"`, ""},
		{"POST", "/nowhere", 404, `"unknown_route"`, ""}, // not the API's
		{"DELETE", "/v1/models", 405, `"method_not_allowed"`, "GET, HEAD"},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rt.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
			if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.body) || rec.Header().Get("Allow") != c.allow {
				t.Fatalf("%d %q (Allow %q), want %d with %q (Allow %q)", rec.Code, rec.Body, rec.Header().Get("Allow"), c.code, c.body, c.allow)
			}
		})
	}
}

func TestInjectsUsage(t *testing.T) {
	for _, c := range []struct {
		path, body string
		want       bool
	}{
		{"/v1/chat/completions", `{"model":"m","stream":true}`, true},
		{"/v1/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, true},
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, false},
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{}}`, false}, // include_usage defaults to true there
		{"/v1/chat/completions", `{"model":"m"}`, false},
		{"/v1/responses", `{"model":"m","stream":true}`, false},
		{"/v1/messages", `{"model":"m","stream":true}`, false},
	} {
		r := httptest.NewRequest("POST", c.path, strings.NewReader(c.body))
		r.Header.Set("Content-Type", "application/json")
		_, req, status := openai.ReadRequest(httptest.NewRecorder(), r, openai.DefaultMaxBodyBytes)
		if status != 0 {
			t.Fatalf("%s %s: read %d", c.path, c.body, status)
		}
		if got := InjectsUsage(c.path, req); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.path, c.body, got, c.want)
		}
	}
}

// gates builds Gates over a tenants file of one tenant, "t", with limits.
func gates(t *testing.T, limits string) (*Gates, *tenant.Tenant) {
	t.Helper()
	cfg, err := tenant.Parse(fmt.Appendf(nil, `{"tiers": {"shared": {"weight": 1}}, "tenants": [{"name": "t", "keys": [%q], "tier": "shared"%s}]}`, tenant.HashKey("k"), limits))
	if err != nil {
		t.Fatal(err)
	}
	g := tenant.NewGate(cfg, nil)
	var ten *tenant.Tenant
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	r.Header.Set("Authorization", "Bearer k")
	g.Require(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { ten = tenant.FromContext(r.Context()) })).ServeHTTP(httptest.NewRecorder(), r)
	if ten == nil {
		t.Fatal("the key names no tenant")
	}
	return &Gates{Tenants: g}, ten
}

func post(body string) *http.Request {
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

// A request of a tenant with a cap passes Read, Prepare and Reserve: its
// body gets the cap as its bound and usage asked (when metered), and its
// worst case is reserved.
func TestGatesPass(t *testing.T) {
	g, ten := gates(t, `, "tpm": 100000, "maxOutputTokens": 50`)
	const body = `{"model":"alias","stream":true,"messages":[{"role":"user","content":"hi"}],"keep_alive":"5m"}`
	w, r := httptest.NewRecorder(), post(body)
	in, f := g.Read(w, r, ten, "/v1/chat/completions")
	if f.Refused() || string(in.Body) != body || in.Read.Model != "alias" {
		t.Fatalf("read: %+v, %+v", f, in)
	}
	if f := g.Prepare(w, r, &in, Changes{Model: "m", DropKeepAlive: true, Meter: true}); f.Refused() {
		t.Fatalf("prepare: %+v (%s)", f, w.Body)
	}
	for _, want := range []string{`"model":"m"`, `"stream_options":{"include_usage":true}`, `"max_completion_tokens":50`} {
		if !strings.Contains(string(in.Body), want) {
			t.Errorf("body %s lacks %s", in.Body, want)
		}
	}
	if strings.Contains(string(in.Body), "keep_alive") || !in.InjectUsage || in.Bound == nil || in.Bound.N != 50 {
		t.Errorf("prepared: %s, inject %v, bound %+v", in.Body, in.InjectUsage, in.Bound)
	}
	if f := g.Reserve(w, r, &in, 0); f.Refused() || in.Reserved <= 50 {
		t.Fatalf("reserve: %+v, reserved %d", f, in.Reserved)
	}
}

// Unmetered, a stream is not asked for usage; without a tenant nothing is
// capped nor reserved, and an unchanged body is the body read.
func TestGatesWithoutTenant(t *testing.T) {
	g := &Gates{}
	const body = `{"model":"m","stream":true,"messages":[]}`
	w, r := httptest.NewRecorder(), post(body)
	in, f := g.Read(w, r, nil, "/v1/chat/completions")
	if f.Refused() {
		t.Fatalf("read: %+v", f)
	}
	if f := g.Prepare(w, r, &in, Changes{}); f.Refused() || in.InjectUsage || in.Bound != nil || string(in.Body) != body {
		t.Fatalf("prepare: %+v, %s", f, in.Body)
	}
	if f := g.Reserve(w, r, &in, 0); f.Refused() || in.Reserved != 0 {
		t.Fatalf("reserve: %+v, %d", f, in.Reserved)
	}
}

// Each gate's refusal is answered, and says whether the tenant's limits
// made it.
func TestGatesRefuse(t *testing.T) {
	t.Run("limits before the body", func(t *testing.T) {
		g, ten := gates(t, `, "rpm": 1`)
		if _, f := g.Read(httptest.NewRecorder(), post(`{"model":"m"}`), ten, "/v1/chat/completions"); f.Refused() {
			t.Fatalf("first request: %+v", f)
		}
		w, r := httptest.NewRecorder(), post(`not json`)
		if _, f := g.Read(w, r, ten, "/v1/chat/completions"); f != (Refusal{Status: 429, RateLimited: true}) || w.Code != 429 {
			t.Fatalf("second request: %+v, answered %d", f, w.Code)
		}
	})
	t.Run("body", func(t *testing.T) {
		w := httptest.NewRecorder()
		if _, f := (&Gates{}).Read(w, post(`not json`), nil, "/v1/chat/completions"); f != (Refusal{Status: 400}) || w.Code != 400 {
			t.Fatalf("%+v, answered %d", f, w.Code)
		}
	})
	t.Run("cap", func(t *testing.T) {
		g, ten := gates(t, `, "maxOutputTokens": 50`)
		w, r := httptest.NewRecorder(), post(`{"model":"m","max_tokens":51}`)
		in, _ := g.Read(w, r, ten, "/v1/chat/completions")
		if f := g.Prepare(w, r, &in, Changes{Meter: true}); f != (Refusal{Status: 400}) || w.Code != 400 {
			t.Fatalf("%+v, answered %d", f, w.Code)
		}
	})
	t.Run("reservation", func(t *testing.T) {
		// A full bucket takes any worst case; the next request finds the
		// tenant in debt for it.
		g, ten := gates(t, `, "tpm": 10`)
		for i, want := range []Refusal{{}, {Status: 429, RateLimited: true}} {
			w, r := httptest.NewRecorder(), post(`{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`)
			in, _ := g.Read(w, r, ten, "/v1/chat/completions")
			if f := g.Prepare(w, r, &in, Changes{Meter: true}); f.Refused() {
				t.Fatalf("prepare: %+v", f)
			}
			if f := g.Reserve(w, r, &in, 0); f != want || f.Refused() != (w.Code == 429) || f.Refused() == (in.Reserved > 1000) {
				t.Fatalf("request %d: %+v, answered %d, reserved %d; want %+v", i, f, w.Code, in.Reserved, want)
			}
		}
	})
}
