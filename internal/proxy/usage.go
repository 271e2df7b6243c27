package proxy

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"strconv"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/record"
)

// Usage receives each finished request's record, after the metrics and the
// access log (poold's usage ledger, package usage). Request must not block
// and may keep rec only to read it: the handler is done with it.
type Usage interface {
	Request(rec *record.Request)
}

// handleUsage binds GET /usage, the usage report (Options.UsageReport),
// when someone may read it: the admin token reads the whole report, which
// ?tenant= may restrict to one tenant; a tenant's key reads its own usage
// only, the report restricted to it, and asking for another tenant's is
// refused with 403. Without an admin token or tenants it stays unbound.
// /usage is key-free at the API-key and tenant layers (openai.KeyFree),
// whose keys share its Authorization header: it authenticates here.
func (h *Handler) handleUsage(mux *http.ServeMux) {
	if h.opts.UsageReport == nil || h.opts.AdminToken == "" && h.opts.Tenants == nil {
		return
	}
	admin := sha256.Sum256([]byte(h.opts.AdminToken))
	mux.HandleFunc("GET /usage", func(w http.ResponseWriter, r *http.Request) {
		if h.opts.AdminToken != "" && bearsToken(r, admin) {
			h.opts.UsageReport.ServeHTTP(w, r)
			return
		}
		if h.opts.Tenants == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="poold admin"`)
			openai.WriteError(w, r, http.StatusUnauthorized, "invalid_admin_token", "", "GET /usage needs the admin token: Authorization: Bearer <token>")
			return
		}
		t := h.opts.Tenants.Config().Lookup(openai.PresentedKey(r.Header))
		if t == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="poold"`)
			openai.WriteError(w, r, http.StatusUnauthorized, "invalid_api_key", "", h.usageCredentials())
			return
		}
		q := r.URL.Query()
		for _, asked := range q["tenant"] {
			if asked != t.Name {
				openai.WriteError(w, r, http.StatusForbidden, "usage_not_allowed", "tenant",
					fmt.Sprintf("tenant %s may read its own usage only, not that of %s", strconv.Quote(t.Name), strconv.Quote(asked)))
				return
			}
		}
		q.Set("tenant", t.Name)
		own := r.Clone(r.Context())
		own.URL.RawQuery = q.Encode()
		h.opts.UsageReport.ServeHTTP(w, own)
	})
}

// usageCredentials says what GET /usage accepts, with tenants.
func (h *Handler) usageCredentials() string {
	if h.opts.AdminToken == "" {
		return "GET /usage needs a tenant's API key, for its own usage: Authorization: Bearer <key> or x-api-key: <key>"
	}
	return "GET /usage needs the admin token (Authorization: Bearer <token>) or a tenant's API key, for its own usage"
}
