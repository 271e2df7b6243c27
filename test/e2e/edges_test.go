package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// answer is one HTTP exchange's outcome as the edge tests read it.
type answer struct {
	status int
	header http.Header
	body   string
}

// do sends one request with an optional bearer key.
func do(t *testing.T, method, url, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// openAIError checks that a is an OpenAI error answer and returns its
// code and message.
func openAIError(t *testing.T, what string, a answer) (code, message string) {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s: %d answer of type %q: %s", what, a.status, ct, a.body)
	}
	e := apiError(t, []byte(a.body))
	c, _ := e.Error.Code.(string)
	return c, e.Error.Message
}

// Every error poold and fleetd answer by themselves is OpenAI-shaped, with
// the status that says what is wrong: 404 for a path, 405 (with Allow) for a
// method, 401 without a key, whose message is not HTML-escaped. Both serve
// GET /v1/models/{id}.
func TestAPIEdgesE2E(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "a"}}, nil), "--api-keys", "sk-1")
	keys := filepath.Join(t.TempDir(), "keys")
	writeFile(t, keys, []byte("sk-1\n"))
	f := startFleetd(t, []*daemon{d}, "--api-keys-file", keys, "--host-api-key-file", keys)
	for _, base := range []struct{ name, url string }{{"poold", d.url}, {"fleetd", f.url}} {
		for _, tt := range []struct {
			method, path, key string
			status            int
			code, allow       string
		}{
			{"GET", "/nope", "sk-1", 404, "unknown_route", ""},
			{"GET", "/v1/chat/completions", "sk-1", 405, "method_not_allowed", "POST"},
			{"PUT", "/status", "", 405, "method_not_allowed", "GET, HEAD"},
			{"POST", "/v1/chat/completions", "", 401, "invalid_api_key", ""},
			{"GET", "/v1/models", "sk-wrong", 401, "invalid_api_key", ""},
		} {
			what := base.name + " " + tt.method + " " + tt.path
			a := do(t, tt.method, base.url+tt.path, tt.key, `{"model":"a"}`)
			if a.status != tt.status || a.header.Get("Allow") != tt.allow {
				t.Errorf("%s: %d Allow %q, want %d Allow %q: %s", what, a.status, a.header.Get("Allow"), tt.status, tt.allow, a.body)
				continue
			}
			if code, msg := openAIError(t, what, a); code != tt.code || tt.status == 401 && !strings.Contains(msg, "Bearer <key>") {
				t.Errorf("%s: code %q message %q", what, code, msg)
			}
		}
	}
	// models.retrieve through fleetd, from the hosts' lists.
	for _, base := range []string{d.url, f.url} {
		a := do(t, "GET", base+"/v1/models/a", "sk-1", "")
		var m struct{ ID, Object, Root string }
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &m) != nil || m.ID != "a" || m.Object != "model" || m.Root != "a" {
			t.Errorf("GET %s/v1/models/a: %d %s", base, a.status, a.body)
		}
		a = do(t, "GET", base+"/v1/models/b", "sk-1", "")
		if code, _ := openAIError(t, "GET /v1/models/b", a); a.status != http.StatusNotFound || code != "model_not_found" {
			t.Errorf("GET %s/v1/models/b: %d %s", base, a.status, a.body)
		}
	}
	a := do(t, "POST", d.url+"/pools/gpu9/v1/chat/completions", "sk-1", `{"model":"a"}`)
	if code, msg := openAIError(t, "pinned to no pool", a); a.status != 404 || code != "pool_not_found" || msg != `pool "gpu9" does not exist; pools: p0` {
		t.Errorf("pinned to a pool that does not exist: %d %s %q", a.status, code, msg)
	}
}
