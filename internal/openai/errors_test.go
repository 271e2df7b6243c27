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
			WriteError(rec, tt.status, tt.code, tt.param, tt.msg)
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
			WriteUnavailable(rec, "queue_timeout", "waited too long", tt.retry)
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
	WriteError(rec, http.StatusUnauthorized, "invalid_api_key", "", msg)
	if !strings.Contains(rec.Body.String(), `Bearer <key> & \"x-api-key: <key>\"`) || !strings.HasSuffix(rec.Body.String(), "}\n") {
		t.Errorf("answer %q", rec.Body)
	}
	if e := decodeError(t, rec); e["message"] != msg {
		t.Errorf("message %q", e["message"])
	}
	for name, ev := range map[string][]byte{
		"stream error": streamError(&StreamError{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: msg}),
		"engine error": ErrorEvent(http.StatusBadRequest, "", []byte("<html>bad & worse</html>")),
	} {
		if s := string(ev); strings.Contains(s, `\u003c`) || strings.Contains(s, `\u0026`) || !strings.Contains(s, "<") {
			t.Errorf("%s event %q", name, ev)
		}
	}
}
