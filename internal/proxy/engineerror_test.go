package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
)

// forwardTo sends one request for path through h's reverse proxy to engine,
// as serveAPI does once it holds a lease on it.
func forwardTo(t *testing.T, h *Handler, engine *httptest.Server, path string) *httptest.ResponseRecorder {
	t.Helper()
	target, err := url.Parse(engine.URL)
	if err != nil {
		t.Fatal(err)
	}
	x := &exchange{id: "r1", ctx: context.Background(), path: path, body: []byte(`{"model":"m"}`),
		lease: &pool.Lease{Target: target, Profile: &profile.Profile{ID: "m"}}}
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"model":"m"}`))
	req = req.WithContext(context.WithValue(req.Context(), exchangeKey{}, x))
	rec := httptest.NewRecorder()
	h.rp.ServeHTTP(rec, req)
	return rec
}

// An engine's error answer reaches the client in poold's shape, OpenAI's
// with a string code (Anthropic's on /v1/messages), keeping the engine's
// status, message and param; an answer already so shaped, a success, a
// stream, a body that is not JSON and one past maxErrorBody pass through
// byte for byte.
func TestEngineErrorsReshaped(t *testing.T) {
	big := `{"detail": "` + strings.Repeat("x", maxErrorBody) + `"}`
	for _, tt := range []struct {
		name, path, ctype string
		status            int
		body              string
		want              string // the body the client gets; "" for the engine's own
	}{
		{"vLLM's 404", "/v1/chat/completions", "application/json", 404,
			`{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`,
			`{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"not_found_error","param":"model","code":"engine_error"}}`},
		{"an older vLLM's, at the top level", "/v1/completions", "application/json", 400,
			`{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}`,
			`{"error":{"message":"max_tokens is too large","type":"invalid_request_error","param":"max_tokens","code":"engine_error"}}`},
		{"a schema error", "/v1/chat/completions", "application/json", 400,
			`{"error":{"message":"1 validation error: messages required","type":"Bad Request","param":"body.messages","code":400}}`,
			`{"error":{"message":"1 validation error: messages required","type":"invalid_request_error","param":"body.messages","code":"engine_error"}}`},
		{"FastAPI's 404: a route the runner does not serve", "/v1/embeddings", "application/json", 404,
			`{"detail":"Not Found"}`,
			`{"error":{"message":"Not Found: the model's engine does not serve this route","type":"not_found_error","param":null,"code":"route_not_served"}}`},
		{"FastAPI's validation", "/v1/chat/completions", "application/json", 422,
			`{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}},{"loc":["body","n"],"msg":"bad"}]}`,
			`{"error":{"message":"body.messages: Field required; body.n: bad","type":"invalid_request_error","param":"body.messages","code":"engine_error"}}`},
		{"an unknown object", "/v1/chat/completions", "application/json; charset=utf-8", 500,
			`{"oops": 1}`,
			`{"error":{"message":"engine answered 500: {\"oops\": 1}","type":"server_error","param":null,"code":"engine_error"}}`},
		{"a string for an error", "/v1/chat/completions", "application/json", 502,
			`{"error":"boom"}`,
			`{"error":{"message":"engine answered 502: {\"error\":\"boom\"}","type":"server_error","param":null,"code":"engine_error"}}`},
		{"not an object", "/v1/chat/completions", "application/json", 500, `["boom"]`, ""},
		{"Messages: FastAPI's 404", "/v1/messages", "application/json", 404,
			`{"detail":"Not Found"}`,
			`{"type":"error","error":{"type":"not_found_error","message":"Not Found: the model's engine does not serve this route","code":"route_not_served"}}`},
		{"Messages: vLLM's OpenAI-shaped error", "/v1/messages", "application/json", 400,
			`{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}}`,
			`{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens is too large","code":"engine_error"}}`},
		{"Messages: Anthropic's already", "/v1/messages", "application/json", 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}`, ""},
		{"OpenAI's already", "/v1/chat/completions", "application/json", 400,
			`{"error": {"message": "bad", "type": "invalid_request_error", "param": null, "code": "x"}}`, ""},
		{"a success", "/v1/chat/completions", "application/json", 200,
			`{"detail":"Not Found"}`, ""},
		{"not JSON", "/v1/chat/completions", "text/plain", 500,
			`Internal Server Error`, ""},
		{"an error event stream", "/v1/chat/completions", "text/event-stream", 400,
			"data: {\"detail\":\"Not Found\"}\n\n", ""},
		{"past the bound", "/v1/chat/completions", "application/json", 400, big, ""},
	} {
		engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", tt.ctype)
			w.WriteHeader(tt.status)
			_, _ = io.WriteString(w, tt.body)
		}))
		rec := forwardTo(t, adminHandler(t, ""), engine, tt.path)
		engine.Close()
		want := tt.want
		if want == "" {
			want = tt.body
		} else {
			want += "\n"
			if !json.Valid([]byte(want)) {
				t.Fatalf("%s: the wanted body is not JSON", tt.name)
			}
		}
		if rec.Code != tt.status || rec.Body.String() != want {
			t.Errorf("%s: %d %.200s\nwant %d %.200s", tt.name, rec.Code, rec.Body, tt.status, want)
		}
		if cl := rec.Header().Get("Content-Length"); cl != "" && cl != strconv.Itoa(rec.Body.Len()) {
			t.Errorf("%s: Content-Length %s for %d bytes", tt.name, cl, rec.Body.Len())
		}
	}
}
