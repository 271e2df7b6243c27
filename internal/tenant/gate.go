package tenant

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/openai"
)

// Gate puts a tenants file in front of an OpenAI API, the same in poold and
// fleetd: it resolves each request's key to its tenant (401 without a known
// one), applies the tenant's limits (429 past them, and OpenAI's
// x-ratelimit-* headers on every inference answer), caps its output tokens,
// reserves each request's worst case in tokens and settles it with the
// tokens used. Which models a tenant sees is the daemon's
// to apply (Tenant.AllowsModel), since only it knows its catalogue.
//
// A nil *Gate is no tenants file: every method lets everything through, as
// without tenancy. A Gate is safe for concurrent use.
type Gate struct {
	cfg     atomic.Pointer[Config]
	limiter Limiter
	local   *Limits // limiter, when it is in memory: a reload applies to it
}

// NewGate returns a gate for c whose limits are kept by l; nil l keeps them
// in memory (Limits).
func NewGate(c *Config, l Limiter) *Gate {
	g := &Gate{limiter: l}
	if l == nil {
		g.local = &Limits{}
		g.limiter = g.local
	}
	g.Set(c)
	return g
}

// Set makes c the tenants in force (a reload): requests in flight keep the
// tenant they were admitted as; the buckets of tenants whose limits did not
// change are kept.
func (g *Gate) Set(c *Config) {
	if g.local != nil {
		g.local.Apply(c)
	}
	g.cfg.Store(c)
}

// Config is the tenants file in force; nil for a nil gate.
func (g *Gate) Config() *Config {
	if g == nil {
		return nil
	}
	return g.cfg.Load()
}

type tenantKey struct{}

// FromContext is the tenant Require found for a request; nil without one.
func FromContext(ctx context.Context) *Tenant {
	t, _ := ctx.Value(tenantKey{}).(*Tenant)
	return t
}

// Require wraps next so that a request carrying no known key gets a 401 in
// poold's shape (openai.WriteError), and one that does carries its tenant in its context
// (FromContext). The key-free paths (openai.KeyFree: the operations
// endpoints, the admin API and /usage, which check their own credentials)
// pass through without a tenant. A nil gate returns next.
func (g *Gate) Require(next http.Handler) http.Handler {
	if g == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openai.KeyFree(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		t := g.cfg.Load().Lookup(openai.PresentedKey(r.Header))
		if t == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="poold"`)
			openai.WriteError(w, r, http.StatusUnauthorized, "invalid_api_key", "", "a valid API key is required: Authorization: Bearer <key> or x-api-key: <key>")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, t)))
	})
}

// Admit applies t's limits to one inference request before its body is
// read: it sets the x-ratelimit-* headers on w and, past a limit (out of
// requests, or in token debt), answers r 429 rate_limit_exceeded with
// Retry-After and returns false. A nil gate or tenant admits.
func (g *Gate) Admit(w http.ResponseWriter, r *http.Request, t *Tenant) bool {
	if g == nil || t == nil || t.RPM <= 0 && t.TPM <= 0 {
		return true
	}
	return g.answer(w, r, t, g.limiter.Admit(t, time.Now()), "")
}

// Reserve takes the worst case of a request of t, tokens (WorstCase), from
// its tokens per minute, once its body is read: it sets the x-ratelimit-*
// headers of tokens on w and, when the bucket does not hold the worst case,
// answers r 429 rate_limit_exceeded naming the limit and the worst case and
// returns false. Settle puts it right when the request ends. A nil gate or
// tenant, or a tenant without tpm, reserves nothing and admits.
func (g *Gate) Reserve(w http.ResponseWriter, r *http.Request, t *Tenant, tokens int) bool {
	if g == nil || t == nil || t.TPM <= 0 {
		return true
	}
	return g.answer(w, r, t, g.limiter.Reserve(t, time.Now(), tokens),
		fmt.Sprintf(", and this request may use up to %d tokens (its prompt's estimate and its output bound)", tokens))
}

// answer sets the headers of d on w and, when d refuses, answers r the 429;
// why ends the message of a refusal on tpm. It reports d.Allowed.
func (g *Gate) answer(w http.ResponseWriter, r *http.Request, t *Tenant, d Decision, why string) bool {
	setRateHeaders(w.Header(), d)
	if d.Allowed {
		return true
	}
	dim, what, limit := "requests", "requests per minute (RPM)", t.RPM
	switch d.Limit {
	case "tpm":
		dim, what, limit = "tokens", "tokens per minute (TPM)", t.TPM
	case "unchecked":
		openai.WriteRateLimited(w, r, dim, fmt.Sprintf("the rate limits of tenant %s could not be checked (the shared limit store is unreachable); try again in %s", strconv.Quote(t.Name), ResetString(d.RetryAfter)), d.RetryAfter)
		return false
	}
	openai.WriteRateLimited(w, r, dim, fmt.Sprintf("rate limit reached for tenant %s on %s: limit %d%s; try again in %s", strconv.Quote(t.Name), what, limit, why, ResetString(d.RetryAfter)), d.RetryAfter)
	return false
}

// Cap applies t's output cap to a request for the inference route path, as
// read: it returns the output bound the body must carry, which Rewrite
// makes its only one (nil: the body's bounds stand as they are). The cap
// bounds the request, not each of its sequences: with n or best_of, the
// bound times their number. A bound that is not a whole number, one above
// the cap, or one that times n passes it gets a 400 naming it, answered
// to r (ok false);
// a request that sets no bound gets the cap divided by n; one with more
// sequences than the cap has tokens is refused. Routes that generate no
// tokens, and tenants without a cap, are left as they are. A nil gate
// returns nil.
func (g *Gate) Cap(w http.ResponseWriter, r *http.Request, t *Tenant, path string, req openai.Request) (_ *openai.OutputCap, ok bool) {
	params := openai.OutputParams(path)
	if g == nil || t == nil || t.MaxOutputTokens <= 0 || params == nil {
		return nil, true
	}
	limit, choices := int64(t.MaxOutputTokens), req.Choices
	refuse := func(code, param, msg string) (*openai.OutputCap, bool) {
		openai.WriteError(w, r, http.StatusBadRequest, code, param, msg)
		return nil, false
	}
	switch {
	case choices < 1:
		return refuse("invalid_value", req.ChoicesParam, fmt.Sprintf("%s must be a whole number of sequences, from 1 to the cap of %d output tokens", req.ChoicesParam, limit))
	case choices > limit:
		return refuse("output_cap_exceeded", req.ChoicesParam, fmt.Sprintf("%s is %d: its sequences would generate more than the cap of %d output tokens of tenant %s", req.ChoicesParam, choices, limit, strconv.Quote(t.Name)))
	}
	var bound *openai.OutputCap
	for _, c := range req.OutputCaps {
		switch {
		case c.N < 0:
			return refuse("invalid_value", c.Param, fmt.Sprintf("%s must be a whole number of tokens, at most %d", c.Param, limit))
		case c.N > limit:
			return refuse("output_cap_exceeded", c.Param, fmt.Sprintf("%s is %d, above the cap of %d output tokens of tenant %s", c.Param, c.N, limit, strconv.Quote(t.Name)))
		case c.N > limit/choices:
			return refuse("output_cap_exceeded", c.Param, fmt.Sprintf("%s × %s is %d × %d = %d output tokens, above the cap of %d of tenant %s: the cap bounds the request, not each sequence", c.Param, req.ChoicesParam, c.N, choices, c.N*choices, limit, strconv.Quote(t.Name)))
		}
		if slices.Contains(params, c.Param) && (bound == nil || c.N < bound.N) {
			bound = &openai.OutputCap{Param: c.Param, N: c.N}
		}
	}
	if bound == nil {
		bound = &openai.OutputCap{Param: params[0], N: limit / choices}
	}
	return bound, true
}

// Settle puts right the reservation of a request of t once it ends, with
// the tokens it used (prompt and completion, or their estimate): what it
// reserved and did not use goes back to the tenant's tokens per minute,
// what it used beyond is taken. A nil gate or tenant does nothing.
func (g *Gate) Settle(t *Tenant, reserved, used int) {
	if g == nil || t == nil || t.TPM <= 0 || reserved == used {
		return
	}
	g.limiter.Settle(t, time.Now(), reserved, used)
}

// The x-ratelimit-* headers, in their canonical form (set without
// canonicalizing each time: the gate's cost is per request).
var (
	requestsHeaders = [3]string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"}
	tokensHeaders   = [3]string{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"}
)

// setRateHeaders sets OpenAI's x-ratelimit-* headers of d on h: the limit,
// what remains and when the bucket is full again ("1s", "6m0s", "20ms"),
// for each dimension with a limit.
func setRateHeaders(h http.Header, d Decision) {
	vals := make([]string, 0, 6) // one allocation for the six values' slices
	for i, b := range []Bucket{d.Requests, d.Tokens} {
		if b.Limit == 0 {
			continue
		}
		names := &requestsHeaders
		if i == 1 {
			names = &tokensHeaders
		}
		for j, v := range [3]string{strconv.Itoa(b.Limit), strconv.Itoa(b.Remaining), ResetString(b.Reset)} {
			vals = append(vals, v)
			h[names[j]] = vals[len(vals)-1 : len(vals) : len(vals)]
		}
	}
}
