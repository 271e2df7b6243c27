package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/tenant"
)

// GET /usage behind the layers poold serves it through (the tenants' gate,
// the API keys, the handler), which all read Authorization: the admin
// token reads the whole report whatever the keys and tenants are; a
// tenant's key reads its own usage only; without an admin token and
// tenants it is unbound.
func TestUsageAuth(t *testing.T) {
	cfg, err := profile.Parse([]byte(adminConfig))
	if err != nil {
		t.Fatal(err)
	}
	tenantsFile, err := tenant.Parse(fmt.Appendf(nil, `{"tiers": {"shared": {"weight": 1}}, "tenants": [
		{"name": "team-a", "keys": [%q], "tier": "shared"},
		{"name": "team-b", "keys": [%q], "tier": "shared"}]}`, tenant.HashKey("key-a"), tenant.HashKey("key-b")))
	if err != nil {
		t.Fatal(err)
	}
	apiKeys, err := openai.NewAPIKeys([]string{"key-x"})
	if err != nil {
		t.Fatal(err)
	}
	report := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("report " + r.URL.RawQuery)) })
	const (
		admin   = "s3cret"
		tenants = "tenants"
		keys    = "api-keys"
	)
	for _, c := range []struct {
		setup       []string // admin, tenants, keys
		header, val string
		query       string
		code        int
		report      string // the query the report saw
	}{
		// The admin token, whatever else is set.
		{[]string{admin}, "Authorization", "Bearer s3cret", "since=1h", 200, "since=1h"},
		{[]string{admin, tenants}, "Authorization", "Bearer s3cret", "since=1h", 200, "since=1h"},
		{[]string{admin, tenants}, "Authorization", "Bearer s3cret", "since=1h&tenant=team-b", 200, "since=1h&tenant=team-b"},
		{[]string{admin, keys}, "Authorization", "Bearer s3cret", "since=1h", 200, "since=1h"},
		{[]string{admin, tenants, keys}, "Authorization", "Bearer s3cret", "since=1h", 200, "since=1h"},
		{[]string{admin}, "", "", "since=1h", 401, ""},
		{[]string{admin}, "Authorization", "Bearer nope", "since=1h", 401, ""},
		{[]string{admin, keys}, "Authorization", "Bearer key-x", "since=1h", 401, ""}, // an API key is no admin token
		// A tenant's key: its own usage only.
		{[]string{admin, tenants}, "Authorization", "Bearer key-a", "since=1h", 200, "since=1h&tenant=team-a"},
		{[]string{tenants}, "X-Api-Key", "key-a", "since=1h", 200, "since=1h&tenant=team-a"},
		{[]string{tenants, keys}, "Authorization", "Bearer key-b", "tenant=team-b", 200, "tenant=team-b"},
		{[]string{admin, tenants}, "Authorization", "Bearer key-a", "tenant=team-b", 403, ""},
		{[]string{admin, tenants}, "Authorization", "Bearer key-a", "tenant=team-a&tenant=team-b", 403, ""},
		{[]string{tenants}, "Authorization", "Bearer s3cret", "", 401, ""}, // no admin token set
		{[]string{admin, tenants}, "Authorization", "Bearer nope", "", 401, ""},
		{[]string{admin, tenants}, "", "", "", 401, ""},
		// Neither: unbound, as before tenants.
		{nil, "Authorization", "Bearer s3cret", "since=1h", 404, ""},
		{[]string{keys}, "Authorization", "Bearer key-x", "since=1h", 404, ""},
	} {
		opts := Options{UsageReport: report}
		var gate *tenant.Gate
		var ks *openai.APIKeys
		for _, s := range c.setup {
			switch s {
			case admin:
				opts.AdminToken = admin
			case tenants:
				gate = tenant.NewGate(tenantsFile, nil)
				opts.Tenants = gate
			case keys:
				ks = apiKeys
			}
		}
		h := gate.Require(ks.Require(New(cfg, pool.NewSet(cfg, pool.Options{}), opts)))
		r := httptest.NewRequest(http.MethodGet, "/usage?"+c.query, nil)
		if c.header != "" {
			r.Header.Set(c.header, c.val)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != c.code || c.code == 200 && rec.Body.String() != "report "+c.report {
			t.Errorf("%v, %s %q, ?%s: %d %s; want %d (report %q)", c.setup, c.header, c.val, c.query, rec.Code, rec.Body, c.code, c.report)
		}
		var e struct{ Error openaiError }
		if c.code == 403 && (json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != "usage_not_allowed" || e.Error.Type != "permission_error") {
			t.Errorf("403: %s", rec.Body)
		}
	}
}
