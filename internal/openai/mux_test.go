package openai

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// What a mux has no route for is answered in the OpenAI shape: 404 for a
// path, 405 with Allow for a method; its routes and redirects are its own.
func TestServeMux(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("models")) })
	mux.HandleFunc("POST /v1/{path...}", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("api")) })
	mux.HandleFunc("GET /dir/", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("dir")) })
	for _, tt := range []struct {
		method, path string
		status       int
		code, allow  string
		body         string
	}{
		{"GET", "/v1/models", 200, "", "", "models"},
		{"POST", "/v1/chat/completions", 200, "", "", "api"},
		{"GET", "/nope", 404, "unknown_route", "", ""},
		{"POST", "/nope", 404, "unknown_route", "", ""},
		{"GET", "/v1/chat/completions", 405, "method_not_allowed", "POST", ""},
		{"DELETE", "/v1/models", 405, "method_not_allowed", "GET, HEAD, POST", ""},
		{"GET", "/dir", http.StatusTemporaryRedirect, "", "", ""}, // to /dir/
	} {
		rec := httptest.NewRecorder()
		ServeMux(mux, rec, httptest.NewRequest(tt.method, tt.path, nil))
		if rec.Code != tt.status {
			t.Errorf("%s %s: status %d, want %d", tt.method, tt.path, rec.Code, tt.status)
			continue
		}
		if rec.Header().Get("Allow") != tt.allow {
			t.Errorf("%s %s: Allow %q, want %q", tt.method, tt.path, rec.Header().Get("Allow"), tt.allow)
		}
		if tt.code == "" {
			if tt.body != "" && rec.Body.String() != tt.body {
				t.Errorf("%s %s: body %q, want the route's", tt.method, tt.path, rec.Body)
			}
			continue
		}
		if e := decodeError(t, rec); e["code"] != tt.code || e["message"] == "" {
			t.Errorf("%s %s: error %v", tt.method, tt.path, e)
		}
	}
}
