// Package pipeline is how both daemons take in an inference request before
// they forward it: which requests are inference requests (Router), the
// order of the gates each passes (Gates), and which get usage asked of the
// engine for them (InjectsUsage). poold forwards to its engines and fleetd
// to its hosts; what is known before the forward is the same for both.
package pipeline

import (
	"net/http"
	"net/url"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/tenant"
)

// Router serves a daemon's inference requests outside its mux, so that the
// mux never cleans or redirects their paths (a redirected POST comes back
// as a GET from most clients): every POST for which IsAPI holds goes to
// API; a request with another method on a path that Route reports an
// inference route gets a 405 naming POST; everything else goes through
// Mux, whose 404 and 405 are in poold's shape (openai.ServeMux).
type Router struct {
	Mux *http.ServeMux
	API http.Handler
	// IsAPI reports that a POST to path is an inference request.
	IsAPI func(path string) bool
	// Route, when not nil, reports that u is an inference route; nil leaves
	// the other methods on every path to Mux.
	Route func(u *url.URL) bool
}

func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && rt.IsAPI(r.URL.Path) {
		rt.API.ServeHTTP(w, r)
		return
	}
	if rt.Route != nil && rt.Route(r.URL) {
		openai.WriteMethodNotAllowed(w, r, http.MethodPost)
		return
	}
	openai.ServeMux(rt.Mux, w, r)
}

// InjectsUsage reports whether a request for path, as read, gets usage
// asked of the engine that the client did not ask for: a stream of the
// two routes whose stream_options the engine reads, without
// include_usage. The daemon that asks withholds the usage-only chunk from
// the client (openai.SSEReader).
func InjectsUsage(path string, req openai.Request) bool {
	return req.Stream && !req.IncludeUsage && (path == "/v1/chat/completions" || path == "/v1/completions")
}

// Gates are the checks an inference request passes before it is
// forwarded, in this order, each answering the client itself when it
// refuses, so that a refused request costs no engine anything:
//
//  1. the tenant's limits (tenant.Gate.Admit), before the body is read;
//  2. the body, read once and validated (openai.ReadRequest);
//     Read does these two;
//  3. the daemon's own checks of what was read (its model, its route),
//     between Read and Prepare;
//  4. the tenant's output cap (tenant.Gate.Cap);
//  5. the body's rewrite (openai.Rewrite): the cap as its only output
//     bound, usage asked of the engine (InjectsUsage) and the daemon's
//     changes; Prepare does these two;
//  6. the reservation of the request's worst case in tokens from the
//     tenant's tokens per minute (Reserve: tenant.WorstCase,
//     tenant.Gate.Reserve), which the daemon settles when the request ends.
//
// What follows is the daemon's: poold holds the body against its queue's
// body budget while the request waits for a lease. The zero Gates has no
// tenants and reads bodies of up to openai.DefaultMaxBodyBytes.
type Gates struct {
	Tenants      *tenant.Gate // nil: no tenants file
	MaxBodyBytes int64        // zero or less: openai.DefaultMaxBodyBytes
}

// Request is an inference request on its way through the gates.
type Request struct {
	Tenant *tenant.Tenant // nil without a tenants file
	Path   string         // the inference route
	Read   openai.Request // the body as read
	// Body is the body as read, and after Prepare as it is forwarded.
	Body []byte
	// Bound is the output bound Prepare made the body's only one (nil:
	// the body's own stand).
	Bound *openai.OutputCap
	// InjectUsage reports that Prepare asked the engine for usage the
	// client did not ask for: the stream's usage-only chunk is withheld.
	InjectUsage bool
	// Reserved is the tokens Reserve reserved against the tenant's tokens
	// per minute, for tenant.Gate.Settle.
	Reserved int
}

// Refusal is how a gate refused a request, already answered; its zero
// value is no refusal.
type Refusal struct {
	Status int // the status sent
	// RateLimited reports that the tenant's limits refused it (a 429).
	RateLimited bool
}

// Refused reports whether a gate refused the request.
func (f Refusal) Refused() bool { return f.Status != 0 }

// Read passes r, an inference request for path of tenant t (nil: none),
// through the first two gates: its tenant's limits, then its body.
func (g *Gates) Read(w http.ResponseWriter, r *http.Request, t *tenant.Tenant, path string) (Request, Refusal) {
	x := Request{Tenant: t, Path: path}
	if !g.Tenants.Admit(w, r, t) {
		return x, Refusal{Status: http.StatusTooManyRequests, RateLimited: true}
	}
	max := g.MaxBodyBytes
	if max <= 0 {
		max = openai.DefaultMaxBodyBytes
	}
	body, req, status := openai.ReadRequest(w, r, max)
	if status != 0 {
		return x, Refusal{Status: status}
	}
	x.Body, x.Read = body, req
	return x, Refusal{}
}

// Changes are the daemon's part of Prepare's rewrite.
type Changes struct {
	// Model and DropKeepAlive are openai.Changes'.
	Model         string
	DropKeepAlive bool
	// Meter reports that the daemon reads the answer's usage: a request
	// that InjectsUsage then gets it asked of the engine.
	Meter bool
}

// Prepare passes x, as Read left it, through the output cap of its tenant
// and the body's rewrite.
func (g *Gates) Prepare(w http.ResponseWriter, r *http.Request, x *Request, c Changes) Refusal {
	bound, ok := g.Tenants.Cap(w, r, x.Tenant, x.Path, x.Read)
	if !ok {
		return Refusal{Status: http.StatusBadRequest}
	}
	x.Bound = bound
	x.InjectUsage = c.Meter && InjectsUsage(x.Path, x.Read)
	x.Body = openai.Rewrite(x.Body, x.Read, openai.Changes{Model: c.Model, InjectUsage: x.InjectUsage, Bound: bound, DropKeepAlive: c.DropKeepAlive})
	return Refusal{}
}

// Reserve passes x, as Prepare left it, through the last gate: the
// reservation of its worst case in tokens, for a tenant with tokens per
// minute. maxModelLen bounds the worst case (as in tenant.WorstCase; zero:
// not known).
func (g *Gates) Reserve(w http.ResponseWriter, r *http.Request, x *Request, maxModelLen int) Refusal {
	t := x.Tenant
	if t == nil || t.TPM <= 0 {
		return Refusal{}
	}
	worst := tenant.WorstCase(x.Path, x.Body, x.Read, x.Bound, maxModelLen)
	if !g.Tenants.Reserve(w, r, t, worst) {
		return Refusal{Status: http.StatusTooManyRequests, RateLimited: true}
	}
	x.Reserved = worst
	return Refusal{}
}
