// Package proxy is poold's HTTP handler: it resolves each request's model to
// a profile, acquires a lease on a pool, forwards the request to that pool's
// engine and streams the answer back unbuffered while counting tokens (the
// OpenAI wire details live in package openai, the connections to engines in
// package upstream). It also serves /v1/models, /status, /health, /ready
// and the admin API.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pipeline"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/record"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
	"github.com/poold/poold/internal/upstream"
)

// Options configures a Handler. Zero values: MaxBodyBytes → openai.DefaultMaxBodyBytes;
// Logger → discard; AccessLog → none; Metrics → none; Tenants → no tenants
// file: every request is client record.NoTenant.
type Options struct {
	MaxBodyBytes int64
	Logger       *slog.Logger
	AccessLog    *slog.Logger
	Metrics      *metrics.Metrics
	// Tenants is the tenants file's gate: the tenant of each request (put
	// in its context by Tenants.Require, which wraps the handler), its
	// limits, output cap, models and share of the engines.
	Tenants *tenant.Gate
	// QueueBodyBytes bounds the request bodies that the requests waiting
	// for a lease hold together, host-wide; past it a request that would
	// wait gets 503 queue_budget. Zero: DefaultQueueBodyBytes; negative:
	// no bound.
	QueueBodyBytes int64
	// Degraded, if not nil, lists why the daemon serves in a degraded state
	// (nil or empty: it does not); /health and /ready show them (both 200).
	Degraded func() []string
	// Status fills the daemon-wide part of GET /status.
	Status func() statusapi.Poold
	// EngineStats, if not nil, fills the EngineStats of the pools whose
	// awake engine has a recent sample (enginestats.Scraper.Fill); nil
	// leaves every pool's nil.
	EngineStats func(pools []statusapi.Pool)
	// ReadyMaxEngineWaiting and ReadyMaxKVCacheUsage are the saturation
	// thresholds of GET /ready: a pool with demand whose engine queues more
	// requests, or uses more of its KV cache, makes it answer 503. Zero:
	// DefaultReadyMaxEngineWaiting and DefaultReadyMaxKVCacheUsage.
	ReadyMaxEngineWaiting int
	ReadyMaxKVCacheUsage  float64
	// KeepAliveInterval is how often a stream waiting for its lease gets an SSE
	// comment line (see keepAlive); zero disables them.
	KeepAliveInterval time.Duration
	// AdminToken, when set, enables POST /admin/pools/{pool}/load, /unload
	// and /clear-backoff for requests bearing it; empty leaves those routes
	// unbound.
	AdminToken string
	// UpstreamHeaderTimeout bounds the wait for an engine's response headers
	// (504 after it); zero waits as long as the client does.
	UpstreamHeaderTimeout time.Duration
	// MaxEventBytes bounds one server-sent event of an engine's stream
	// (larger ends the stream with an error event); zero means
	// openai.DefaultMaxEvent.
	MaxEventBytes int64
	// StreamIdleTimeout bounds the silence of an engine's answer: between
	// the complete events of a stream, whatever bytes trickle between them,
	// and between the bytes of a plain body. Past it the answer ends (a
	// stream with an engine_timeout error event) and the engine, stalled,
	// is restarted. Zero: no bound.
	StreamIdleTimeout time.Duration
	// Usage, when set, receives every finished request's record (usage.go);
	// UsageReport, when set with an AdminToken or Tenants, serves GET
	// /usage, to the admin token and to each tenant for its own usage
	// (handleUsage).
	Usage       Usage
	UsageReport http.Handler
}

// Handler serves the OpenAI API and the operations endpoints.
type Handler struct {
	cfg   atomic.Pointer[profile.Config] // the profiles requests resolve against; see SetConfig
	pools *pool.Set
	opts  Options
	log   *slog.Logger
	rp    *httputil.ReverseProxy
	tr    *upstream.Transport // the engines' connections, rp's Transport
	mux   *http.ServeMux
	// router sends the inference requests to serveAPI, the rest to mux;
	// gates are the checks those pass before a lease is asked for.
	router pipeline.Router
	gates  pipeline.Gates
	seq    atomic.Uint64 // request ids
	// created is the "created" time of every /v1/models entry: when the
	// profiles were loaded.
	created int64
	// bodies bounds the bodies held by requests waiting for a lease.
	bodies bodyBudget
	// draining, once set by Drain, makes /health answer 503.
	draining atomic.Bool
	// cut ends, by Cut, the requests still forwarded at the end of a
	// shutdown's drain (cause errShutdownCut).
	cut    context.Context
	cutAll context.CancelFunc
	// tokenTimes are each profile's time per token, for the estimate of
	// an answer abandoned before its usage.
	tokenTimes tokenTimes
}

// errShutdownCut is the cause of the end of a request still running when a
// shutdown's drain bound passes.
var errShutdownCut = errors.New("poold is shutting down: the request ran past the drain bound")

// New builds the handler for cfg served by pools.
func New(cfg *profile.Config, pools *pool.Set, opts Options) *Handler {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = openai.DefaultMaxBodyBytes
	}
	if opts.QueueBodyBytes == 0 {
		opts.QueueBodyBytes = DefaultQueueBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ReadyMaxEngineWaiting == 0 {
		opts.ReadyMaxEngineWaiting = DefaultReadyMaxEngineWaiting
	}
	if opts.ReadyMaxKVCacheUsage == 0 {
		opts.ReadyMaxKVCacheUsage = DefaultReadyMaxKVCacheUsage
	}
	h := &Handler{pools: pools, opts: opts, log: opts.Logger.With("component", "proxy"), created: time.Now().Unix()}
	h.cut, h.cutAll = context.WithCancel(context.Background())
	h.bodies.max = opts.QueueBodyBytes
	h.gates = pipeline.Gates{Tenants: opts.Tenants, MaxBodyBytes: opts.MaxBodyBytes}
	h.cfg.Store(cfg)
	h.tr = &upstream.Transport{HeaderTimeout: opts.UpstreamHeaderTimeout, BodyIdleTimeout: opts.StreamIdleTimeout}
	h.rp = &httputil.ReverseProxy{
		Rewrite:        h.rewriteOut,
		Transport:      h.tr,
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.upstreamError,
		ErrorLog:       slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
		BufferPool:     &upstream.BufferPool{},
		// FlushInterval stays zero: ReverseProxy flushes an event stream (or
		// a body of unknown length) after every write anyway, and a plain
		// answer then leaves in one write with its headers. A negative one
		// would start a goroutine per response that sends the headers ahead.
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", h.serveModels)
	mux.HandleFunc("GET /v1/models/{id...}", h.serveModel)
	mux.HandleFunc("GET /pools/{pool}/metrics", h.serveEngineMetrics)
	mux.HandleFunc("GET /status", h.serveStatus)
	mux.HandleFunc("GET /health", h.serveHealth)
	mux.HandleFunc("GET /ready", h.serveReady)
	if opts.AdminToken != "" {
		h.handleAdmin(mux, opts.AdminToken)
	}
	h.handleUsage(mux)
	h.mux = mux
	h.router = pipeline.Router{
		Mux:   mux,
		API:   http.HandlerFunc(h.serveAPI),
		IsAPI: func(path string) bool { return !strings.HasPrefix(path, "/admin/") },
		Route: func(u *url.URL) bool { _, ok := routeOf(u); return ok },
	}
	return h
}

// SetConfig makes cfg the profiles that requests resolve against. A reload
// calls it after applying cfg to the pools, so that a name resolved here is
// one the pools know.
func (h *Handler) SetConfig(cfg *profile.Config) {
	h.cfg.Store(cfg)
	h.tokenTimes.forget(func(id string) bool { return cfg.Lookup(id) != nil })
}

// Handle adds another route (such as /metrics) to the handler's mux.
func (h *Handler) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

// ServeHTTP serves every POST but the admin API's as an inference request,
// which serveAPI routes by its path (routeOf), outside the mux
// (pipeline.Router); another method on an inference route is a 405;
// everything else goes through the mux, whose 404 and 405 are in poold's
// shape too.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.router.ServeHTTP(w, r) }

// Close closes the idle connections to engines and stops their sweep. Call
// it once the server has stopped.
func (h *Handler) Close() { h.tr.Close() }

// EngineConnsClosed is how many idle connections an engine closed before
// poold did (upstream.Transport.UpstreamClosed).
func (h *Handler) EngineConnsClosed() uint64 { return h.tr.UpstreamClosed() }

// Drain makes /health answer 503, so that a load balancer stops sending:
// the first step of a shutdown.
func (h *Handler) Drain() { h.draining.Store(true) }

// Cut ends every request still forwarded, at the end of a shutdown's drain:
// a stream gets a shutting_down error event, a request whose engine has not
// answered yet a 503 shutting_down, and both are recorded with the outcome
// shutdown_cut. Requests that arrive afterwards are cut at once.
func (h *Handler) Cut() { h.cutAll() }

// exchange is one forwarded request's state, carried in its context from
// serveAPI through the ReverseProxy callbacks.
type exchange struct {
	id       string          // the request id, sent upstream as X-Request-Id
	ctx      context.Context // the forward's: the client's, cut by a shutdown; nil before
	lease    *pool.Lease
	path     string // the engine's path: an inference route
	body     []byte
	form     bool // the body is a multipart/form-data form, not JSON
	withhold bool
	start    time.Time
	first    time.Time // first response byte sent
	sse      *openai.SSEReader
	tail     *openai.UsageReader
	status   int
	client   string // the request's client class
	// prompt is poold's estimate of the prompt tokens (0 on a route that
	// runs no model), choices the sequences asked for (n, best_of) and
	// maxOutput the request's output bound (0: none), for the estimate of
	// an answer whose usage poold could not read (bill).
	prompt    int
	choices   int
	maxOutput int64
	generates bool      // the route generates tokens (openai.OutputParams)
	sent      time.Time // when the request went to the engine; zero before
	// plain is set once a plain (not streamed) answer's headers came:
	// the engine made it whole, so the client's leaving no longer cancels
	// the exchange, and the rest is read for its usage.
	plain atomic.Bool
	// timing and timed time a stream's chunks of generated text (TTFT,
	// ITL); kept here so that a stream costs no allocation for them.
	timing metrics.StreamTiming
	timed  timedStream
}

type exchangeKey struct{}

func (x *exchange) markFirst() { x.first = time.Now() }

// outcome says how the exchange ended (record.Outcome*), given the status
// recorded and whether the client has gone.
func (x *exchange) outcome(status int, clientGone bool) string {
	ended, upErr := true, error(nil)
	switch {
	case x.sse != nil:
		ended, upErr = x.sse.Ended(), x.sse.Err()
	case x.tail != nil:
		ended, upErr = x.tail.Ended(), x.tail.Err()
	}
	switch {
	case status == 499 || clientGone && !ended:
		return record.OutcomeClientAborted
	case upErr != nil:
		return record.OutcomeUpstreamAborted
	}
	return record.OutcomeCompleted
}

// bill puts the request's tokens in rec, whose Status, Outcome and Profile
// are set: the engine's usage when the answer carried it (learning from a
// completed one the engine's time per token); else, for an answer that
// went to the engine on a route that runs a model, poold's estimate,
// flagged TokensEstimated: the prompt from the body's size, and
//   - for an answer that did not complete (abandoned, cut, broken off),
//     what the engine made up to the cut: the chunks of text the client
//     got (a stream), or the time the engine worked at the profile's time
//     per token, within the request's output bound (a plain answer);
//   - for a completed 2xx answer without usage poold can read, the chunks
//     of text a stream carried (0 for a plain body).
func (x *exchange) bill(rec *record.Request, times *tokenTimes) {
	if u, ok := x.usage(); ok {
		rec.Counted, rec.PromptTokens, rec.CompletionTokens = true, u.PromptTokens, u.CompletionTokens
		if rec.Outcome == record.OutcomeCompleted && rec.Status == http.StatusOK {
			end := time.Now()
			if x.tail != nil && !x.first.IsZero() {
				end = x.first // a plain answer comes once made
			}
			times.observe(rec.Profile, end.Sub(x.sent), u.CompletionTokens/max(1, x.choices))
		}
		return
	}
	completed := rec.Outcome == record.OutcomeCompleted
	if x.sent.IsZero() || x.prompt == 0 || completed && (rec.Status/100 != 2 || x.sse == nil && x.tail == nil) {
		return
	}
	rec.TokensEstimated, rec.PromptTokens = true, x.prompt
	switch {
	case x.sse != nil:
		rec.CompletionTokens = x.sse.ContentChunks()
	case !completed && x.generates:
		n := times.estimate(rec.Profile, time.Since(x.sent)) * int64(max(1, x.choices))
		if x.maxOutput > 0 {
			n = min(n, x.maxOutput)
		}
		rec.CompletionTokens = int(n)
	}
}

func (x *exchange) usage() (openai.Usage, bool) {
	switch {
	case x.sse != nil:
		return x.sse.Usage()
	case x.tail != nil:
		return x.tail.Usage()
	}
	return openai.Usage{}, false
}

// serveAPI handles a POST to an inference route and its pinned form
// /pools/{pool}/<route>; any other path gets a 404 before the body is read,
// so that it costs no swap.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ten := tenant.FromContext(r.Context())
	rec := &record.Request{RequestID: openai.RequestID(r, "poold", &h.seq), Client: record.NoTenant}
	caller := pool.Caller{}
	if ten != nil {
		rec.Client = ten.Name
		caller = pool.Caller{Tenant: ten.Name, Weight: ten.Weight(), Background: ten.Background(), MaySwap: ten.AllowsPool}
	}
	w.Header().Set("X-Request-Id", rec.RequestID)
	x := &exchange{id: rec.RequestID, start: start, client: rec.Client}
	client := w   // the writer that ClientStalled knows; w is wrapped below
	reserved := 0 // the tokens reserved against the tenant's limit, settled at the end
	defer func() {
		if rec.Status == 0 {
			// Forwarded (or aborted mid-stream, which unwinds through here).
			rec.Status = x.status
			if rec.Status == 0 {
				rec.Status = 499 // the client closed the request before any answer
			}
		}
		rec.Duration = time.Since(start)
		if !x.first.IsZero() {
			rec.TTFB = x.first.Sub(start)
		}
		x.timing.Record(rec)
		if rec.Outcome == "" {
			rec.Outcome = x.outcome(rec.Status, r.Context().Err() != nil)
		}
		if openai.ClientStalled(client) {
			// Cut by openai.WriteDeadline: the lease is released and the
			// engine's request cancelled as the handler returns.
			rec.Outcome = record.OutcomeClientStalled
			h.log.Info("client stopped reading: answer cut", "request_id", rec.RequestID, "pool", rec.Pool, "profile", rec.Profile,
				"setting", openai.ClientWriteTimeoutSetting)
		}
		// Cut by a shutdown: an answer under way, or none yet from the engine.
		if x.ctx != nil && context.Cause(x.ctx) == errShutdownCut && (rec.Outcome != record.OutcomeCompleted || x.sse == nil && x.tail == nil) {
			rec.Outcome = record.OutcomeShutdownCut
		}
		x.bill(rec, &h.tokenTimes)
		if x.lease != nil {
			rec.CausedSwap = x.lease.CausedSwap
		}
		h.opts.Tenants.Settle(ten, reserved, rec.PromptTokens+rec.CompletionTokens)
		h.finish(rec)
	}()

	rt, ok := routeOf(r.URL)
	if !ok {
		rec.Status = http.StatusNotFound
		openai.WriteError(w, r, rec.Status, "unknown_route", "", fmt.Sprintf("POST %s is not an inference route that poold forwards", strconv.Quote(r.URL.EscapedPath())))
		return
	}
	if rt.pool != "" && h.pools.Pool(rt.pool) == nil {
		rec.Status = http.StatusNotFound
		openai.WriteError(w, r, rec.Status, "pool_not_found", "", h.unknownPool(rt.pool))
		return
	}
	r.SetPathValue("pool", rt.pool)
	x.path = rt.path
	if ok, why := forwardedHeaders(r.Header); !ok {
		rec.Status = http.StatusRequestHeaderFieldsTooLarge
		openai.WriteError(w, r, rec.Status, "headers_too_large", "", why)
		return
	}
	// The gates, in both daemons' order (pipeline.Gates).
	in, refused := h.gates.Read(w, r, ten, rt.path)
	if refused.Refused() {
		recordRefusal(rec, refused)
		return
	}
	req := in.Read
	rec.Model, rec.Stream = req.Model, req.Stream
	if req.Form && !formRoutes[rt.path] {
		rec.Status = http.StatusBadRequest
		openai.WriteError(w, r, rec.Status, "invalid_body", "", fmt.Sprintf("a multipart/form-data body is for the audio routes; POST %s takes JSON", rt.path))
		return
	}
	prof := h.cfg.Load().Lookup(req.Model)
	if prof == nil || ten != nil && !ten.AllowsModel(req.Model, prof.ID) {
		rec.Status = http.StatusNotFound
		openai.WriteError(w, r, rec.Status, "model_not_found", "model", h.unknownModel(req.Model, ten))
		return
	}
	rec.Profile = prof.ID
	// Refused before any pool is asked: a swap would load an engine that
	// answers the route 404 anyway.
	if msg := notServed(prof, rt.path); msg != "" {
		rec.Status = http.StatusNotFound
		openai.WriteError(w, r, rec.Status, "route_not_served", "", msg)
		return
	}
	if refused := h.gates.Prepare(w, r, &in, pipeline.Changes{Model: prof.ID, DropKeepAlive: true, Meter: true}); refused.Refused() {
		recordRefusal(rec, refused)
		return
	}
	x.body = in.Body
	x.form = req.Form
	keep := req.KeepAlive
	if req.HasKeepAlive && ten != nil {
		keep = ten.KeepAlive(keep)
	}
	rec.KeepAlive, rec.HasKeepAlive = keep, req.HasKeepAlive
	x.withhold = in.InjectUsage
	x.choices, x.generates = int(max(1, req.Choices)), openai.OutputParams(rt.path) != nil
	if !untokened[rt.path] {
		x.prompt = openai.EstimatePromptTokens(x.body, req)
	}
	if n, ok := req.MaxOutput(rt.path, in.Bound); ok {
		x.maxOutput = n
	}
	if refused := h.gates.Reserve(w, r, &in, prof.MaxModelLen); refused.Refused() {
		recordRefusal(rec, refused)
		return
	}
	reserved = in.Reserved

	// A request that must wait holds its body against the host's budget.
	hold, unqueue, done := h.bodies.request(int64(len(x.body)))
	defer done()
	var lease *pool.Lease
	var err error
	if req.Stream && h.opts.KeepAliveInterval > 0 {
		k := &keepAlive{ResponseWriter: w, anthropic: openai.AnthropicRoute(rt.path)}
		defer k.finish()
		w = k
		lease, err = h.acquireKeepAlive(k, r, prof, caller, start, hold)
	} else {
		lease, err = h.pools.Acquire(r.Context(), prof, r.PathValue("pool"), caller, hold)
	}
	unqueue()
	if err != nil {
		rec.Status = h.acquireError(w, r, prof, err)
		return
	}
	if req.HasKeepAlive {
		lease.Keep(keep) // from the answer's end: the lease's release
	}
	defer lease.Release()
	rec.Pool, rec.QueueWait = lease.Pool, lease.Waited

	x.lease = lease
	// The exchange ends with a shutdown's cut, or when the client leaves,
	// which makes the engine stop working on it (vLLM aborts a request
	// whose connection closes); but not once a plain answer's headers
	// came: the engine made it whole, and the rest is read for its usage.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	defer cancel(nil)
	defer context.AfterFunc(h.cut, func() { cancel(errShutdownCut) })()
	defer context.AfterFunc(r.Context(), func() {
		if !x.plain.Load() {
			cancel(context.Cause(r.Context()))
		}
	})()
	x.ctx, x.sent = ctx, time.Now()
	fwd := upstream.WithIdleTimeout(context.WithValue(ctx, exchangeKey{}, x), lease.IdleTimeout)
	h.rp.ServeHTTP(&statusWriter{ResponseWriter: w, status: &x.status}, r.WithContext(fwd))
	if x.succeeded(r.Context().Err() != nil) {
		lease.Succeeded()
	}
}

// succeeded reports whether the engine answered the forwarded request
// successfully, given whether the client has gone: a 2xx answer that
// completed, and for a stream one that carried generated text (vLLM ends
// the stream of a request whose engine core died with an error event and
// [DONE], under a 200).
func (x *exchange) succeeded(clientGone bool) bool {
	return x.status/100 == 2 && x.outcome(x.status, clientGone) == record.OutcomeCompleted && (x.sse == nil || x.sse.ContentChunks() > 0)
}

// recordRefusal records in rec a request that a gate refused (and answered).
func recordRefusal(rec *record.Request, f pipeline.Refusal) {
	rec.Status = f.Status
	if f.RateLimited {
		rec.Outcome = record.OutcomeRateLimited
	}
}

// finish records a finished request in the metrics and the access log.
func (h *Handler) finish(rec *record.Request) {
	if h.opts.Metrics != nil {
		h.opts.Metrics.Observe(rec)
	}
	if h.opts.AccessLog != nil {
		rec.Log(h.opts.AccessLog)
	}
	if h.opts.Usage != nil {
		h.opts.Usage.Request(rec)
	}
}
