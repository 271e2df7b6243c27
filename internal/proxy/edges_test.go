package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// serve sends one request to h.
func serve(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return rec
}

// apiError decodes an OpenAI error answer, failing the test on any other.
func apiError(t *testing.T, rec *httptest.ResponseRecorder) openaiError {
	t.Helper()
	var e struct{ Error *openaiError }
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%d answer of type %q: %s", rec.Code, ct, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("%d answer %s is not an OpenAI error (%v)", rec.Code, rec.Body, err)
	}
	return *e.Error
}

// Every error poold answers by itself is OpenAI-shaped: an unknown path, a
// method a path is not served with (with Allow), on every kind of path.
func TestErrorShapes(t *testing.T) {
	h := adminHandler(t, "tok")
	for _, tt := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/nope", 404, "unknown_route", ""},
		{"GET", "/v1", 404, "unknown_route", ""},
		{"POST", "/nope", 404, "unknown_route", ""},
		{"GET", "/v1/chat/completions", 405, "method_not_allowed", "POST"},
		{"PUT", "/pools/a/v1/embeddings", 405, "method_not_allowed", "POST"},
		{"DELETE", "/v1/models", 405, "method_not_allowed", "GET, HEAD"},
		{"POST", "/status", 404, "unknown_route", ""}, // every POST is an inference request
		{"PUT", "/status", 405, "method_not_allowed", "GET, HEAD"},
		{"GET", "/admin/pools/a/load", 405, "method_not_allowed", "POST"},
		{"GET", "/pools/a/nope", 404, "unknown_route", ""},
	} {
		rec := serve(h, tt.method, tt.path, "")
		if rec.Code != tt.status || rec.Header().Get("Allow") != tt.allow {
			t.Errorf("%s %s: %d Allow %q, want %d Allow %q", tt.method, tt.path, rec.Code, rec.Header().Get("Allow"), tt.status, tt.allow)
			continue
		}
		if e := apiError(t, rec); e.Code != tt.code {
			t.Errorf("%s %s: code %v, want %s", tt.method, tt.path, e.Code, tt.code)
		}
	}
}

// A request pinned to a pool that does not exist says so, whatever its
// model; one pinned to a pool its model may not use says that.
func TestPinnedPoolErrors(t *testing.T) {
	h := adminHandler(t, "")
	for _, tt := range []struct {
		path, model, want string
	}{
		{"/pools/gpu9/v1/chat/completions", "m", `pool "gpu9" does not exist; pools: a, b`},
		{"/pools/gpu9/v1/chat/completions", "unknown", `pool "gpu9" does not exist; pools: a, b`},
		{"/pools/a/v1/chat/completions", "only-b", `model "only-b" is not served on pool "a"`},
	} {
		rec := serve(h, "POST", tt.path, `{"model":"`+tt.model+`"}`)
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", tt.path, tt.model, rec.Code)
			continue
		}
		if e := apiError(t, rec); e.Code != "pool_not_found" || e.Message != tt.want {
			t.Errorf("%s %s: %+v, want pool_not_found %q", tt.path, tt.model, e, tt.want)
		}
	}
	rec := serve(h, "GET", "/pools/gpu9/metrics", "")
	if e := apiError(t, rec); rec.Code != http.StatusNotFound || e.Message != `pool "gpu9" does not exist; pools: a, b` {
		t.Errorf("engine metrics of an unknown pool: %d %+v", rec.Code, e)
	}
}

// A form is the body of the audio routes only: anywhere else it is a 400,
// before any pool is asked for its model.
func TestFormOnlyOnAudioRoutes(t *testing.T) {
	h := adminHandler(t, "")
	body := "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\ntrue\r\n--b--\r\n"
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Content-Type", "multipart/form-data; boundary=b")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if e := apiError(t, rec); rec.Code != http.StatusBadRequest || e.Code != "invalid_body" || !strings.Contains(e.Message, "takes JSON") {
			t.Errorf("a form to %s: %d %+v", path, rec.Code, e)
		}
	}
}
