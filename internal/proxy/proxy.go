// Package proxy is poold's HTTP handler: it resolves each request's model to
// a profile, acquires a lease on a pool, forwards the request to that pool's
// engine and streams the answer back unbuffered while counting tokens (the
// OpenAI wire details live in package openai, the connections to engines in
// package upstream). It also serves /v1/models, /status, /health and the
// admin API.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/upstream"
)

// Options configures a Handler. Zero values: MaxBodyBytes → openai.DefaultMaxBodyBytes;
// Logger → discard; AccessLog → none; Metrics → none; Clients → every request
// is client "other".
type Options struct {
	MaxBodyBytes int64
	Logger       *slog.Logger
	AccessLog    *slog.Logger
	Metrics      *metrics.Metrics
	Clients      *metrics.Clients
	// Status fills the daemon-wide part of GET /status.
	Status func() statusapi.Poold
	// KeepAliveInterval is how often a stream waiting for its lease gets an SSE
	// comment line (see keepAlive); zero disables them.
	KeepAliveInterval time.Duration
	// AdminToken, when set, enables POST /admin/pools/{pool}/load and /unload
	// for requests bearing it; empty leaves those routes unbound.
	AdminToken string
	// UpstreamHeaderTimeout bounds the wait for an engine's response headers
	// (504 after it); zero waits as long as the client does.
	UpstreamHeaderTimeout time.Duration
	// MaxEventBytes bounds one server-sent event of an engine's stream
	// (larger ends the stream with an error event); zero means
	// openai.DefaultMaxEvent.
	MaxEventBytes int64
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
	seq   atomic.Uint64 // request ids
	// created is the "created" time of every /v1/models entry: when the
	// profiles were loaded.
	created int64
}

// New builds the handler for cfg served by pools.
func New(cfg *profile.Config, pools *pool.Set, opts Options) *Handler {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = openai.DefaultMaxBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{pools: pools, opts: opts, log: opts.Logger.With("component", "proxy"), created: time.Now().Unix()}
	h.cfg.Store(cfg)
	h.tr = &upstream.Transport{HeaderTimeout: opts.UpstreamHeaderTimeout}
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
	mux.HandleFunc("POST /v1/{path...}", h.serveAPI)
	mux.HandleFunc("POST /pools/{pool}/v1/{path...}", h.serveAPI)
	mux.HandleFunc("GET /v1/models", h.serveModels)
	mux.HandleFunc("GET /pools/{pool}/metrics", h.serveEngineMetrics)
	mux.HandleFunc("GET /status", h.serveStatus)
	mux.HandleFunc("GET /health", h.serveHealth)
	if opts.AdminToken != "" {
		h.handleAdmin(mux, opts.AdminToken)
	}
	h.mux = mux
	return h
}

// SetConfig makes cfg the profiles that requests resolve against. A reload
// calls it after applying cfg to the pools, so that a name resolved here is
// one the pools know.
func (h *Handler) SetConfig(cfg *profile.Config) { h.cfg.Store(cfg) }

// Handle adds another route (such as /metrics) to the handler's mux.
func (h *Handler) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Close closes the idle connections to engines and stops their sweep. Call
// it once the server has stopped.
func (h *Handler) Close() { h.tr.Close() }

// EngineConnsClosed is how many idle connections an engine closed before
// poold did (upstream.Transport.UpstreamClosed).
func (h *Handler) EngineConnsClosed() uint64 { return h.tr.UpstreamClosed() }

// exchange is one forwarded request's state, carried in its context from
// serveAPI through the ReverseProxy callbacks.
type exchange struct {
	id       string // the request id, sent upstream as X-Request-Id
	lease    *pool.Lease
	body     []byte
	withhold bool
	start    time.Time
	first    time.Time // first response byte sent
	sse      *openai.SSEReader
	tail     *openai.UsageReader
	status   int
}

type exchangeKey struct{}

func (x *exchange) markFirst() { x.first = time.Now() }

// outcome says how the exchange ended (metrics.Outcome*), given the status
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
		return metrics.OutcomeClientAborted
	case upErr != nil:
		return metrics.OutcomeUpstreamAborted
	}
	return metrics.OutcomeCompleted
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

// serveAPI handles POST /v1/* and its pinned form /pools/{pool}/v1/*.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &metrics.Record{RequestID: openai.RequestID(r, "poold", &h.seq), Client: h.opts.Clients.Classify(r.Header)}
	w.Header().Set("X-Request-Id", rec.RequestID)
	x := &exchange{id: rec.RequestID, start: start}
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
		rec.Outcome = x.outcome(rec.Status, r.Context().Err() != nil)
		if u, ok := x.usage(); ok {
			rec.Counted, rec.PromptTokens, rec.CompletionTokens = true, u.PromptTokens, u.CompletionTokens
		} else if x.sse != nil && rec.Outcome != metrics.OutcomeCompleted {
			// Cut or abandoned before the usage chunk: what the client got.
			rec.TokensEstimated, rec.CompletionTokens = true, x.sse.ContentChunks()
		}
		h.finish(rec)
	}()

	body, req, status := openai.ReadRequest(w, r, h.opts.MaxBodyBytes)
	if status != 0 {
		rec.Status = status
		return
	}
	rec.Model, rec.Stream = req.Model, req.Stream
	prof := h.cfg.Load().Lookup(req.Model)
	if prof == nil {
		rec.Status = http.StatusNotFound
		openai.WriteError(w, rec.Status, "model_not_found", "model", h.unknownModel(req.Model))
		return
	}
	rec.Profile = prof.ID

	var lease *pool.Lease
	var err error
	if req.Stream && h.opts.KeepAliveInterval > 0 {
		k := &keepAlive{ResponseWriter: w}
		defer k.finish()
		w = k
		lease, err = h.acquireKeepAlive(k, r, prof, start)
	} else {
		lease, err = h.pools.Acquire(r.Context(), prof, r.PathValue("pool"))
	}
	if err != nil {
		rec.Status = h.acquireError(w, r, prof, err)
		return
	}
	defer lease.Release()
	rec.Pool, rec.QueueWait = lease.Pool, lease.Waited

	path := r.PathValue("path")
	inject := req.Stream && !req.IncludeUsage && (path == "chat/completions" || path == "completions")
	x.lease = lease
	x.body = openai.Rewrite(body, req, prof.ID, inject)
	x.withhold = inject
	ctx := upstream.WithIdleTimeout(context.WithValue(r.Context(), exchangeKey{}, x), lease.IdleTimeout)
	h.rp.ServeHTTP(&statusWriter{ResponseWriter: w, status: &x.status}, r.WithContext(ctx))
}

// finish records a finished request in the metrics and the access log.
func (h *Handler) finish(rec *metrics.Record) {
	if h.opts.Metrics != nil {
		h.opts.Metrics.Observe(rec)
	}
	if h.opts.AccessLog != nil {
		rec.Log(h.opts.AccessLog)
	}
}

// acquireError answers a request that got no lease and returns the status sent.
func (h *Handler) acquireError(w http.ResponseWriter, r *http.Request, prof *profile.Profile, err error) int {
	var qe *pool.QueueError
	var le *pool.LoadError
	switch {
	case r.Context().Err() != nil:
		return 499
	case errors.As(err, &qe):
		code := "queue_full"
		switch {
		case errors.Is(err, pool.ErrQueueTimeout):
			code = "queue_timeout"
		case errors.Is(err, pool.ErrBackoff):
			code = "engine_backoff"
		}
		openai.WriteUnavailable(w, code, fmt.Sprintf("model %q: %v", prof.ID, err), qe.RetryAfter)
		return http.StatusServiceUnavailable
	case errors.As(err, &le):
		openai.WriteError(w, http.StatusBadGateway, "engine_failed", "", err.Error())
		return http.StatusBadGateway
	case errors.Is(err, pool.ErrNoPool):
		openai.WriteError(w, http.StatusNotFound, "pool_not_found", "", fmt.Sprintf("model %q is not served on pool %q", prof.ID, r.PathValue("pool")))
		return http.StatusNotFound
	case errors.Is(err, pool.ErrShutdown):
		openai.WriteUnavailable(w, "shutting_down", err.Error(), 5*time.Second)
		return http.StatusServiceUnavailable
	case errors.Is(err, pool.ErrProfileRemoved):
		openai.WriteError(w, http.StatusNotFound, "model_not_found", "model", fmt.Sprintf("model %q: %v", prof.ID, err))
		return http.StatusNotFound
	case errors.Is(err, pool.ErrPoolRemoved):
		openai.WriteUnavailable(w, "pool_removed", fmt.Sprintf("model %q: %v", prof.ID, err), time.Second)
		return http.StatusServiceUnavailable
	default:
		openai.WriteError(w, http.StatusInternalServerError, "internal_error", "", err.Error())
		return http.StatusInternalServerError
	}
}

// maxListed bounds the names listed in a 404.
const maxListed = 50

func (h *Handler) unknownModel(name string) string {
	names := h.cfg.Load().Names()
	more := ""
	if len(names) > maxListed {
		more = fmt.Sprintf(" and %d more", len(names)-maxListed)
		names = names[:maxListed]
	}
	return fmt.Sprintf("model %s does not exist; available models: %s%s", strconv.Quote(name), strings.Join(names, ", "), more)
}

// rewriteOut builds the upstream request: the engine's URL, the rewritten body,
// and no client credentials (engines are not meant to see API keys).
func (h *Handler) rewriteOut(pr *httputil.ProxyRequest) {
	x := pr.In.Context().Value(exchangeKey{}).(*exchange)
	out := pr.Out
	out.URL.Scheme = x.lease.Target.Scheme
	out.URL.Host = x.lease.Target.Host
	out.URL.Path = "/v1/" + pr.In.PathValue("path")
	out.URL.RawPath = ""
	out.Host = ""
	upstream.SetBody(out, x.body)
	out.Header.Del("Authorization")
	out.Header.Del("X-Api-Key")
	// The engine takes it as its own request id (vLLM does), so that its
	// log lines match the access log's.
	out.Header.Set("X-Request-Id", x.id)
	out.Header.Del("Accept-Encoding")
}

// modifyResponse wraps the engine's response body to count tokens and, for
// streams where poold asked for usage, withhold the usage-only chunk.
func (h *Handler) modifyResponse(resp *http.Response) error {
	x := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	// The client has poold's X-Request-Id already; an engine's echo of it
	// (vLLM's --enable-request-id-headers) would be a second.
	resp.Header.Del("X-Request-Id")
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		x.sse = openai.NewSSEReader(resp.Body, x.withhold, x.markFirst)
		x.sse.SetMaxEvent(int(h.opts.MaxEventBytes))
		resp.Body = x.sse
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return nil
	}
	x.tail = openai.NewUsageReader(resp.Body, x.markFirst)
	resp.Body = x.tail
	return nil
}

// upstreamError answers a request whose engine could not be reached or failed
// before sending a response.
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	x := r.Context().Value(exchangeKey{}).(*exchange)
	h.log.Warn("engine request failed", "pool", x.lease.Pool, "profile", x.lease.Profile.ID, "err", err)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		openai.WriteError(w, http.StatusGatewayTimeout, "engine_timeout", "", fmt.Sprintf("engine for %q did not answer in time: %v", x.lease.Profile.ID, err))
		return
	}
	openai.WriteError(w, http.StatusBadGateway, "engine_unavailable", "", fmt.Sprintf("engine for %q failed: %v", x.lease.Profile.ID, err))
}

// statusWriter remembers the status written through it. It forwards Flush and
// Unwrap so that streaming keeps working.
type statusWriter struct {
	http.ResponseWriter
	status *int
}

func (s *statusWriter) WriteHeader(code int) {
	if *s.status == 0 {
		*s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if *s.status == 0 {
		*s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() { http.NewResponseController(s.ResponseWriter).Flush() }

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
