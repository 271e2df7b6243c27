package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
)

// messagesConfig's pools are built but never run: every request below is
// refused before it reaches an engine. "embed" runs a pooling model, which
// does not serve the Messages route.
const messagesConfig = `{
  "pools": [{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [1]}],
  "profiles": [
    {"id": "m", "model": "org/m", "command": ["true", "{port}"]},
    {"id": "only-b", "model": "org/b", "pools": ["b"], "command": ["true", "{port}"]},
    {"id": "embed", "model": "org/e", "command": ["true", "{port}", "--runner", "pooling"]}
  ]
}`

// anthropicErr is Anthropic's error body, with poold's code.
type anthropicErr struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Code    string `json:"code"`
	} `json:"error"`
}

// anthropicError decodes an error answer in Anthropic's shape, failing the
// test on any other (an OpenAI error has no top-level type).
func anthropicError(t *testing.T, rec *httptest.ResponseRecorder) anthropicErr {
	t.Helper()
	var e anthropicErr
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%d answer of type %q: %s", rec.Code, ct, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" || e.Error.Code == "" {
		t.Fatalf("%d answer %s is not an Anthropic error (%v)", rec.Code, rec.Body, err)
	}
	return e
}

// Every refusal poold answers by itself on the Messages route, plain or
// pinned to a pool, is in Anthropic's shape with Anthropic's type for its
// status and poold's code; the same refusals on the chat route stay
// OpenAI's.
func TestOwnErrorsOnMessagesRoute(t *testing.T) {
	cfg, err := profile.Parse([]byte(messagesConfig))
	if err != nil {
		t.Fatal(err)
	}
	h := New(cfg, pool.NewSet(cfg, pool.Options{}), Options{MaxBodyBytes: 256})
	form := "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--\r\n"
	for _, tt := range []struct {
		name, method string
		pin          string // the pool it is pinned to; "": unpinned, and pinned to b
		body         string
		header       http.Header
		status       int
		typ, code    string // Anthropic's type; poold's code
	}{
		{"unknown model", "POST", "", `{"model":"nope"}`, nil, 404, "not_found_error", "model_not_found"},
		{"bad JSON", "POST", "", `{"model":`, nil, 400, "invalid_request_error", "invalid_body"},
		{"a body too large", "POST", "", `{"model":"m","x":"` + strings.Repeat("x", 300) + `"}`, nil, 413, "request_too_large", "body_too_large"},
		{"a form", "POST", "", form, http.Header{"Content-Type": {"multipart/form-data; boundary=b"}}, 400, "invalid_request_error", "invalid_body"},
		{"a pooling model", "POST", "", `{"model":"embed"}`, nil, 404, "not_found_error", "route_not_served"},
		{"too many headers", "POST", "", `{"model":"m"}`, http.Header{"X-Many": make([]string, maxForwardedHeaders+1)}, 431, "invalid_request_error", "headers_too_large"},
		{"an unknown pool", "POST", "/pools/gpu9", `{"model":"m"}`, nil, 404, "not_found_error", "pool_not_found"},
		{"a model not on the pool", "POST", "/pools/a", `{"model":"only-b"}`, nil, 404, "not_found_error", "pool_not_found"},
		{"GET", "GET", "", "", nil, 405, "invalid_request_error", "method_not_allowed"},
	} {
		pins := []string{"", "/pools/b"}
		if tt.pin != "" {
			pins = []string{tt.pin}
		}
		for _, route := range []string{"/v1/messages", "/v1/chat/completions"} {
			for _, pin := range pins {
				path := pin + route
				r := httptest.NewRequest(tt.method, path, strings.NewReader(tt.body))
				for k, v := range tt.header {
					r.Header[k] = v
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				if rec.Code != tt.status {
					t.Errorf("%s to %s: %d %s, want %d", tt.name, path, rec.Code, rec.Body, tt.status)
					continue
				}
				if route == "/v1/chat/completions" {
					if e := apiError(t, rec); e.Code != tt.code {
						t.Errorf("%s to %s: code %v, want %s", tt.name, path, e.Code, tt.code)
					}
					continue
				}
				if e := anthropicError(t, rec); e.Error.Type != tt.typ || e.Error.Code != tt.code {
					t.Errorf("%s to %s: %s, want type %s code %s", tt.name, path, rec.Body, tt.typ, tt.code)
				}
			}
		}
	}
}

// A request on the Messages route that got no lease is refused in
// Anthropic's shape, keeping the status and the headers (Retry-After,
// X-Poold-Refused) that fleetd and clients act on.
func TestAcquireErrorsOnMessagesRoute(t *testing.T) {
	h := adminHandler(t, "")
	prof := &profile.Profile{ID: "m"}
	for _, tt := range []struct {
		err            error
		status         int
		typ, code      string
		retry, refused string
	}{
		{&pool.QueueError{Err: pool.ErrQueueFull, RetryAfter: 2 * time.Second}, 503, "overloaded_error", "queue_full", "2", "queue_full"},
		{&pool.QueueError{Err: pool.ErrQueueTimeout, RetryAfter: 30 * time.Second}, 503, "overloaded_error", "queue_timeout", "30", ""},
		{&pool.QueueError{Err: fmt.Errorf("%w: try later", pool.ErrBackoff), RetryAfter: time.Second}, 503, "overloaded_error", "engine_backoff", "1", "engine_backoff"},
		{pool.ErrShutdown, 503, "overloaded_error", "shutting_down", "5", "shutting_down"},
		{pool.ErrPoolRemoved, 503, "overloaded_error", "pool_removed", "1", "pool_removed"},
		{&pool.LoadError{Err: errors.New("exit 1")}, 502, "api_error", "engine_failed", "", ""},
		{pool.ErrProfileRemoved, 404, "not_found_error", "model_not_found", "", ""},
		{errors.New("unexpected"), 500, "api_error", "internal_error", "", ""},
	} {
		rec := httptest.NewRecorder()
		status := h.acquireError(rec, httptest.NewRequest("POST", "/pools/a/v1/messages", nil), prof, tt.err)
		e := anthropicError(t, rec)
		if status != tt.status || rec.Code != tt.status || e.Error.Type != tt.typ || e.Error.Code != tt.code ||
			rec.Header().Get("Retry-After") != tt.retry || rec.Header().Get("X-Poold-Refused") != tt.refused {
			t.Errorf("%v: %d %s %v", tt.err, rec.Code, rec.Body, rec.Header())
		}
	}
}

// An engine that cannot be reached gets the Messages route's client a 502
// in Anthropic's shape.
func TestEngineUnreachableOnMessagesRoute(t *testing.T) {
	engine := httptest.NewServer(http.NotFoundHandler())
	engine.Close() // its address now refuses connections
	rec := forwardTo(t, adminHandler(t, ""), engine, "/v1/messages")
	if e := anthropicError(t, rec); rec.Code != http.StatusBadGateway || e.Error.Type != "api_error" || e.Error.Code != "engine_unavailable" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

// A stream the engine breaks off ends with poold's error event: Anthropic's
// `event: error` on the Messages route, OpenAI's data event elsewhere.
func TestStreamCutOnMessagesRoute(t *testing.T) {
	const start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n"
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(start))
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the engine dies mid-stream
	}))
	defer engine.Close()
	h := adminHandler(t, "")

	rec := forwardTo(t, h, engine, "/v1/messages")
	body, ok := strings.CutPrefix(rec.Body.String(), start)
	data, isEvent := strings.CutPrefix(body, "event: error\ndata: ")
	var e anthropicErr
	if !ok || !isEvent || !strings.HasSuffix(data, "}\n\n") || json.Unmarshal([]byte(data), &e) != nil ||
		e.Type != "error" || e.Error.Type != "api_error" || e.Error.Code != "engine_stream_failed" || !strings.Contains(e.Error.Message, "engine stream failed") {
		t.Fatalf("Messages stream %q", rec.Body)
	}

	rec = forwardTo(t, h, engine, "/v1/chat/completions")
	body, ok = strings.CutPrefix(rec.Body.String(), start)
	data, isEvent = strings.CutPrefix(body, "data: ")
	var oe struct{ Error openaiError }
	if !ok || !isEvent || json.Unmarshal([]byte(data), &oe) != nil || oe.Error.Code != "engine_stream_failed" {
		t.Fatalf("chat stream %q", rec.Body)
	}
}
