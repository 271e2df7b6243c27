package openai

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// post is a request to path, whose route decides an error's shape.
func post(path string) *http.Request { return httptest.NewRequest(http.MethodPost, path, nil) }

// decodeError checks a recorded error response's shape and returns its fields.
func decodeError(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	var body map[string]map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if len(body) != 1 || body["error"] == nil {
		t.Fatalf("body %s: want exactly one member, error", rec.Body)
	}
	e := body["error"]
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e[k]; !ok {
			t.Errorf("error lacks %q: %s", k, rec.Body)
		}
	}
	if len(e) != 4 {
		t.Errorf("error has %d members: %s", len(e), rec.Body)
	}
	return e
}

func TestWriteError(t *testing.T) {
	tests := []struct {
		status      int
		code, param string
		msg, typ    string
	}{
		{http.StatusBadRequest, "invalid_body", "", `invalid request body: "model" is required`, "invalid_request_error"},
		{http.StatusBadRequest, "invalid_body", "model", "bad <model> & co", "invalid_request_error"},
		{http.StatusNotFound, "model_not_found", "model", `model "x" not found; available: a, b`, "not_found_error"},
		{http.StatusRequestEntityTooLarge, "body_too_large", "", "too big", "invalid_request_error"},
		{http.StatusUnauthorized, "unauthorized", "", "no key", "authentication_error"},
		{http.StatusForbidden, "pool_not_allowed", "", "not yours", "permission_error"},
		{http.StatusServiceUnavailable, "queue_full", "", "full", "service_unavailable"},
		{http.StatusBadGateway, "engine_failed", "", "engine died", "server_error"},
		{http.StatusInternalServerError, "internal_error", "", "oops", "server_error"},
	}
	for _, tt := range tests {
		t.Run(tt.code+"/"+tt.param, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteError(rec, post("/v1/chat/completions"), tt.status, tt.code, tt.param, tt.msg)
			if rec.Code != tt.status {
				t.Errorf("status = %d, want %d", rec.Code, tt.status)
			}
			e := decodeError(t, rec)
			if e["message"] != tt.msg || e["type"] != tt.typ || e["code"] != tt.code {
				t.Errorf("error = %v", e)
			}
			if tt.param == "" {
				if e["param"] != nil {
					t.Errorf("param = %v, want null", e["param"])
				}
			} else if e["param"] != tt.param {
				t.Errorf("param = %v, want %q", e["param"], tt.param)
			}
			if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("X-Content-Type-Options missing")
			}
			if rec.Header().Get("Retry-After") != "" {
				t.Errorf("Retry-After set on a %d", tt.status)
			}
		})
	}
}

func TestWriteUnavailable(t *testing.T) {
	tests := []struct {
		retry time.Duration
		want  string
	}{
		{0, "1"},
		{-5 * time.Second, "1"},
		{math.MinInt64, "1"},
		{time.Nanosecond, "1"},
		{999 * time.Millisecond, "1"},
		{time.Second, "1"},
		{time.Second + time.Nanosecond, "2"},
		{1500 * time.Millisecond, "2"},
		{5 * time.Second, "5"},
		{90*time.Second + time.Millisecond, "91"},
		{time.Hour, "3600"},
		{math.MaxInt64, "9223372037"},
	}
	for _, tt := range tests {
		t.Run(tt.retry.String(), func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteUnavailable(rec, post("/v1/completions"), "queue_timeout", "waited too long", tt.retry)
			if rec.Code != http.StatusServiceUnavailable {
				t.Errorf("status = %d", rec.Code)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.want {
				t.Errorf("Retry-After = %q, want %q", got, tt.want)
			}
			e := decodeError(t, rec)
			if e["type"] != "service_unavailable" || e["code"] != "queue_timeout" || e["message"] != "waited too long" || e["param"] != nil {
				t.Errorf("error = %v", e)
			}
		})
	}
}

// Error JSON is not HTML-escaped: a message says <key> as written, in an
// answer, in the error event that ends a stream and in one made of an
// engine's answer.
func TestErrorsNotHTMLEscaped(t *testing.T) {
	const msg = `send Authorization: Bearer <key> & "x-api-key: <key>"`
	rec := httptest.NewRecorder()
	WriteError(rec, post("/v1/chat/completions"), http.StatusUnauthorized, "invalid_api_key", "", msg)
	if !strings.Contains(rec.Body.String(), `Bearer <key> & \"x-api-key: <key>\"`) || !strings.HasSuffix(rec.Body.String(), "}\n") {
		t.Errorf("answer %q", rec.Body)
	}
	if e := decodeError(t, rec); e["message"] != msg {
		t.Errorf("message %q", e["message"])
	}
	for name, ev := range map[string][]byte{
		"stream error":           streamError(&StreamError{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: msg}, false),
		"engine error":           ErrorEvent(http.StatusBadRequest, "", []byte("<html>bad & worse</html>"), false),
		"Anthropic stream error": streamError(&StreamError{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: msg}, true),
		"Anthropic engine error": ErrorEvent(http.StatusBadRequest, "", []byte("<html>bad & worse</html>"), true),
	} {
		if s := string(ev); strings.Contains(s, `\u003c`) || strings.Contains(s, `\u0026`) || !strings.Contains(s, "<") {
			t.Errorf("%s event %q", name, ev)
		}
	}
}

// decodeAnthropic checks that a recorded error response is in Anthropic's
// shape, {"type": "error", "error": {"type", "message", "code"}}, and
// returns the error's members.
func decodeAnthropic(t *testing.T, rec *httptest.ResponseRecorder) map[string]string {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	var body struct {
		Type  *string           `json:"type"`
		Error map[string]string `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	var top map[string]json.RawMessage
	_ = json.Unmarshal(rec.Body.Bytes(), &top)
	if len(top) != 2 || body.Type == nil || *body.Type != "error" || len(body.Error) != 3 {
		t.Fatalf("body %s: want Anthropic's error shape", rec.Body)
	}
	return body.Error
}

// The Messages route's path, plain or pinned to a pool, and no other.
func TestAnthropicRoute(t *testing.T) {
	for path, want := range map[string]bool{
		"/v1/messages":                    true,
		"/pools/gpu0/v1/messages":         true,
		"/v1/chat/completions":            false,
		"/pools/gpu0/v1/completions":      false,
		"/v1/messages/":                   false,
		"/v1/messages/count_tokens":       false,
		"/pools//v1/messages":             false,
		"/pools/v1/messages":              false,
		"/pools/a/b/v1/messages":          false,
		"/v2/messages":                    false,
		"/messages":                       false,
		"/pools/gpu0/pools/a/v1/messages": false,
	} {
		if got := AnthropicRoute(path); got != want {
			t.Errorf("AnthropicRoute(%q) = %v, want %v", path, got, want)
		}
	}
}

// On the Messages route poold's own errors are in Anthropic's shape, with
// Anthropic's type for the status and poold's code beside the message, and
// keep their status and headers; on every other route they stay OpenAI's.
func TestWriteErrorOnMessagesRoute(t *testing.T) {
	tests := []struct {
		status      int
		code, param string
		typ         string // Anthropic's
	}{
		{http.StatusBadRequest, "invalid_body", "max_tokens", "invalid_request_error"},
		{http.StatusUnauthorized, "invalid_api_key", "", "authentication_error"},
		{http.StatusForbidden, "pool_not_allowed", "", "permission_error"},
		{http.StatusNotFound, "model_not_found", "model", "not_found_error"},
		{http.StatusMethodNotAllowed, "method_not_allowed", "", "invalid_request_error"},
		{http.StatusRequestEntityTooLarge, "body_too_large", "", "request_too_large"},
		{http.StatusRequestHeaderFieldsTooLarge, "headers_too_large", "", "invalid_request_error"},
		{http.StatusInternalServerError, "internal_error", "", "api_error"},
		{http.StatusBadGateway, "engine_unavailable", "", "api_error"},
		{http.StatusGatewayTimeout, "engine_timeout", "", "api_error"},
	}
	for _, path := range []string{"/v1/messages", "/pools/gpu0/v1/messages"} {
		for _, tt := range tests {
			rec := httptest.NewRecorder()
			WriteError(rec, post(path), tt.status, tt.code, tt.param, "msg <x>")
			e := decodeAnthropic(t, rec)
			if rec.Code != tt.status || e["type"] != tt.typ || e["code"] != tt.code || e["message"] != "msg <x>" {
				t.Errorf("%s %d %s: %d %s", path, tt.status, tt.code, rec.Code, rec.Body)
			}
		}
		rec := httptest.NewRecorder()
		WriteUnavailable(rec, post(path), "queue_full", "full", 3*time.Second)
		if e := decodeAnthropic(t, rec); rec.Code != 503 || rec.Header().Get("Retry-After") != "3" || e["type"] != "overloaded_error" || e["code"] != "queue_full" {
			t.Errorf("%s: 503: %d %s %v", path, rec.Code, rec.Body, rec.Header())
		}
		rec = httptest.NewRecorder()
		WriteRateLimited(rec, post(path), "tokens", "slow down", 1500*time.Millisecond)
		if e := decodeAnthropic(t, rec); rec.Code != 429 || rec.Header().Get("Retry-After") != "2" || e["type"] != "rate_limit_error" || e["code"] != "rate_limit_exceeded" {
			t.Errorf("%s: 429: %d %s %v", path, rec.Code, rec.Body, rec.Header())
		}
	}
	for _, r := range []*http.Request{post("/v1/chat/completions"), post("/pools/gpu0/v1/embeddings"), post("/v1/messages/"), nil} {
		rec := httptest.NewRecorder()
		WriteRateLimited(rec, r, "tokens", "slow down", time.Second)
		if e := decodeError(t, rec); e["type"] != "tokens" || e["code"] != "rate_limit_exceeded" {
			t.Errorf("%v: %s", r, rec.Body)
		}
	}
}

// A kept error answer ends a Messages stream as Anthropic's error event:
// an Anthropic body as it is, any other as the message, and the retry hint
// in the message.
func TestErrorEventOnMessagesRoute(t *testing.T) {
	for _, tt := range []struct {
		name       string
		status     int
		retryAfter string
		body       string
		want       string
	}{
		{"Anthropic's body", 503, "30", `{"type":"error","error":{"type":"overloaded_error","message":"queue timeout","code":"queue_timeout"}}`,
			`{"type":"error","error":{"type":"overloaded_error","message":"queue timeout (retry after 30s)","code":"queue_timeout"}}`},
		{"the engine's own Anthropic body", 400, "", `{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}`,
			`{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}`},
		{"OpenAI's body", 502, "", `{"error":{"message":"m","type":"server_error","param":null,"code":"engine_failed"}}`,
			`{"type":"error","error":{"type":"api_error","message":"engine answered 502: {\"error\":{\"message\":\"m\",\"type\":\"server_error\",\"param\":null,\"code\":\"engine_failed\"}}","code":"engine_error"}}`},
		{"not JSON", 500, "", "Internal Server Error",
			`{"type":"error","error":{"type":"api_error","message":"engine answered 500: Internal Server Error","code":"engine_error"}}`},
	} {
		got := string(ErrorEvent(tt.status, tt.retryAfter, []byte(tt.body), true))
		if want := "event: error\ndata: " + tt.want + "\n\n"; got != want {
			t.Errorf("%s: event %q\nwant %q", tt.name, got, want)
		}
	}
	if got := string(ErrorEvent(503, "", []byte(`{"type":"error","error":{"type":"overloaded_error","message":"x"}}`), false)); !strings.HasPrefix(got, "data: {\"error\":{") {
		t.Errorf("off the Messages route: %q", got)
	}
}
