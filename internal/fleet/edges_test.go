package fleet

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// What fleetd has no route for is answered in the OpenAI shape: 404 for a
// path, 405 with Allow for a method.
func TestErrorShapes(t *testing.T) {
	h := NewHandler(New(Options{}), HandlerOptions{})
	for _, tt := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/nope", 404, "unknown_route", ""},
		{"POST", "/nope", 404, "unknown_route", ""},
		{"GET", "/v1/chat/completions", 405, "method_not_allowed", "POST"},
		{"PUT", "/status", 405, "method_not_allowed", "GET, HEAD"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
		var e struct {
			Error struct {
				Message, Type string
				Code          any
			}
		}
		if rec.Code != tt.status || rec.Header().Get("Allow") != tt.allow || rec.Header().Get("Content-Type") != "application/json" ||
			json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != tt.code || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s %s: %d Allow %q %s; want %d Allow %q, an OpenAI error %s", tt.method, tt.path,
				rec.Code, rec.Header().Get("Allow"), rec.Body, tt.status, tt.allow, tt.code)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/models", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("GET /v1/models: %d", rec.Code)
	}
}
