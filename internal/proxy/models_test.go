package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
)

// GET /v1/models/{id} answers a name's entry of GET /v1/models, ids with a
// slash and aliases included, with the profile's maxModelLen; an unknown
// name is a 404 model_not_found. (With a profile loaded, the engine's
// max_model_len is read too: test/e2e.)
func TestRetrieveModel(t *testing.T) {
	cfg, err := profile.Parse([]byte(`{
	  "pools": [{"name": "a", "gpus": [0]}],
	  "profiles": [
	    {"id": "org/m", "aliases": ["m"], "model": "org/m", "maxModelLen": 8192, "command": ["true", "{port}"]},
	    {"id": "n", "model": "n", "command": ["true", "{port}"]}
	  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	h := New(cfg, pool.NewSet(cfg, pool.Options{}), Options{})
	var list statusapi.ModelList[statusapi.Model]
	if rec := serve(h, "GET", "/v1/models", ""); rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &list) != nil || len(list.Data) != 3 {
		t.Fatalf("GET /v1/models: %d %s", rec.Code, rec.Body)
	}
	for _, want := range list.Data {
		rec := serve(h, "GET", "/v1/models/"+want.ID, "")
		var got statusapi.Model
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil {
			t.Fatalf("GET /v1/models/%s: %d %s", want.ID, rec.Code, rec.Body)
		}
		if got.ID != want.ID || got.Object != "model" || got.Root != want.Root || got.State != "available" || got.MaxModelLen != want.MaxModelLen || len(got.Pools) != 1 {
			t.Errorf("GET /v1/models/%s: %+v, want the list's %+v", want.ID, got, want)
		}
		if wantLen := map[string]int{"org/m": 8192, "m": 8192, "n": 0}[want.ID]; got.MaxModelLen != wantLen {
			t.Errorf("%s: max_model_len %d, want %d", want.ID, got.MaxModelLen, wantLen)
		}
	}
	// Clients escape the slash of an id in the path (openai-go does).
	var got statusapi.Model
	if rec := serve(h, "GET", "/v1/models/org%2Fm", ""); rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil || got.ID != "org/m" {
		t.Errorf("GET /v1/models/org%%2Fm: %d %s", rec.Code, rec.Body)
	}
	rec := serve(h, "GET", "/v1/models/nope", "")
	if e := apiError(t, rec); rec.Code != http.StatusNotFound || e.Code != "model_not_found" || e.Param == nil || *e.Param != "model" {
		t.Errorf("an unknown model: %d %+v", rec.Code, e)
	}
}

// poold's JSON is not HTML-escaped: names (and errors in /status) read as
// written.
func TestJSONNotHTMLEscaped(t *testing.T) {
	cfg, err := profile.Parse([]byte(`{"pools": [{"name": "a", "gpus": [0]}], "profiles": [{"id": "a<b>&c", "model": "m", "command": ["true", "{port}"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	h := New(cfg, pool.NewSet(cfg, pool.Options{}), Options{})
	if rec := serve(h, "GET", "/v1/models", ""); !strings.Contains(rec.Body.String(), `"id": "a<b>&c"`) {
		t.Errorf("GET /v1/models: %s", rec.Body)
	}
}

// A tenant retrieves only the models it may use: another is not found, as
// one that does not exist.
func TestRetrieveModelTenant(t *testing.T) {
	cfg, err := profile.Parse([]byte(`{"pools": [{"name": "a", "gpus": [0]}], "profiles": [
	  {"id": "qwen", "aliases": ["chat"], "model": "m", "command": ["true", "{port}"]},
	  {"id": "llama", "model": "m", "command": ["true", "{port}"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	tenants, err := tenant.Parse([]byte(`{"tiers": {"shared": {"weight": 1}}, "tenants": [{"name": "team-a", "keys": ["` + tenant.HashKey("sk-a") + `"], "tier": "shared", "models": ["qwen*"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	h := tenant.NewGate(tenants, nil).Require(New(cfg, pool.NewSet(cfg, pool.Options{}), Options{}))
	get := func(id string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/v1/models/"+id, nil)
		req.Header.Set("Authorization", "Bearer sk-a")
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, id := range []string{"qwen", "chat"} {
		if rec := get(id); rec.Code != http.StatusOK {
			t.Errorf("team-a retrieving %s: %d %s", id, rec.Code, rec.Body)
		}
	}
	hidden, missing := get("llama"), get("nope")
	he, me := apiError(t, hidden), apiError(t, missing)
	if hidden.Code != http.StatusNotFound || he.Code != "model_not_found" || strings.ReplaceAll(he.Message, "llama", "X") != strings.ReplaceAll(me.Message, "nope", "X") {
		t.Errorf("team-a retrieving llama: %d %+v; nope: %+v", hidden.Code, he, me)
	}
}
