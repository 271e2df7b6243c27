package fleet

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/poold/poold/internal/statusapi"
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

// GET /v1/models/{id} answers a name's entry of GET /v1/models, with the
// smallest max_model_len the hosts give; an unknown name is a 404
// model_not_found.
func TestRetrieveModel(t *testing.T) {
	a := newFakeHost(t, "a", []statusapi.Pool{readyPool("gpu0", "org/qwen", 0)},
		hostModel{ID: "chat", Root: "org/qwen", State: "ready", MaxModelLen: 8192}, hostModel{ID: "org/qwen", Root: "org/qwen", State: "ready", MaxModelLen: 8192})
	b := newFakeHost(t, "b", []statusapi.Pool{emptyPool("gpu0")},
		hostModel{ID: "org/qwen", Root: "org/qwen", State: "available", MaxModelLen: 4096}, hostModel{ID: "bge", Root: "bge", State: "available"})
	tf := startFleet(t, Options{}, HandlerOptions{}, a, b)
	get := func(path string) (int, []byte) {
		resp, err := http.Get(tf.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}
	for _, tt := range []struct {
		id, root, state string
		maxLen, hosts   int
	}{
		{"org/qwen", "org/qwen", "ready", 4096, 2},
		{"chat", "org/qwen", "ready", 8192, 1},
		{"bge", "bge", "available", 0, 1},
	} {
		status, body := get("/v1/models/" + tt.id)
		var m statusapi.FleetModel
		if status != http.StatusOK || json.Unmarshal(body, &m) != nil {
			t.Fatalf("GET /v1/models/%s: %d %s", tt.id, status, body)
		}
		if m.ID != tt.id || m.Object != "model" || m.Root != tt.root || m.State != tt.state || m.MaxModelLen != tt.maxLen || len(m.Hosts) != tt.hosts {
			t.Errorf("GET /v1/models/%s: %+v", tt.id, m)
		}
	}
	status, body := get("/v1/models/nope")
	var e struct{ Error struct{ Code, Param string } }
	if status != http.StatusNotFound || json.Unmarshal(body, &e) != nil || e.Error.Code != "model_not_found" || e.Error.Param != "model" {
		t.Errorf("an unknown model: %d %s", status, body)
	}
}

// fleetd's JSON is not HTML-escaped: names read as written.
func TestJSONNotHTMLEscaped(t *testing.T) {
	a := newFakeHost(t, "a", []statusapi.Pool{readyPool("gpu0", "a<b>&c", 0)}, model("a<b>&c", "a<b>&c"))
	tf := startFleet(t, Options{}, HandlerOptions{}, a)
	resp, err := http.Get(tf.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), `"id": "a<b>&c"`) {
		t.Errorf("GET /v1/models: %s", b)
	}
}
