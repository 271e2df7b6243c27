package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/placement"
	"github.com/poold/poold/internal/upstream"
)

// Defaults for HandlerOptions' zero values.
const (
	DefaultMaxAttempts    = 3
	DefaultAffinityHeader = "X-Session-Id"
	DefaultAffinityBytes  = 512
	// DefaultScaleOutWait is the scale-out threshold fleetd's command line
	// uses unless told otherwise (the zero HandlerOptions value disables it).
	DefaultScaleOutWait = 2 * time.Second
	// DefaultLoadSlack is the load slack fleetd's command line uses unless
	// told otherwise (the zero HandlerOptions value means none).
	DefaultLoadSlack = 1
)

// HandlerOptions configures a Handler. Zero values: MaxBodyBytes →
// openai.DefaultMaxBodyBytes; MaxAttempts → DefaultMaxAttempts;
// AffinityHeader → DefaultAffinityHeader; AffinityBytes → DefaultAffinityBytes;
// ScaleOutWait → scale-out off; Logger → discard; AccessLog → none.
type HandlerOptions struct {
	MaxBodyBytes int64
	// MaxAttempts bounds the hosts one request is tried on: a host is skipped
	// for the next only when it could not be reached or answered 503, and
	// never once a response byte reached the client.
	MaxAttempts int
	// AffinityHeader carries a client's session key; requests without it are
	// keyed by the first AffinityBytes bytes of their first message (or
	// prompt, or input), so that a shared system prompt keeps hitting one
	// host's prefix cache.
	AffinityHeader string
	AffinityBytes  int
	// LoadSlack is RouteOptions.Slack: how many requests more than the least
	// loaded host of its tier a host may have and still win by affinity.
	LoadSlack int
	// ScaleOutWait: when every awake copy of a model has a queue wait (recent
	// time to first byte of its streams) above this, and an idle or asleep
	// eligible pool exists on another host, requests go there, which loads
	// another copy.
	ScaleOutWait time.Duration
	Version      string
	Logger       *slog.Logger
	AccessLog    *slog.Logger
}

// Handler is fleetd's HTTP surface: POST /v1/* forwarded to the best host,
// GET /v1/models (the union), GET /status (the fleet view) and GET /health.
type Handler struct {
	fleet *Fleet
	opts  HandlerOptions
	log   *slog.Logger
	rp    *httputil.ReverseProxy
	tr    *upstream.Transport // the hosts' connections, rp's Transport
	mux   *http.ServeMux
	seq   atomic.Uint64 // request ids
}

// NewHandler builds the handler for f.
func NewHandler(f *Fleet, opts HandlerOptions) *Handler {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = openai.DefaultMaxBodyBytes
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.AffinityHeader == "" {
		opts.AffinityHeader = DefaultAffinityHeader
	}
	if opts.AffinityBytes <= 0 {
		opts.AffinityBytes = DefaultAffinityBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{fleet: f, opts: opts, log: opts.Logger.With("component", "router"), tr: &upstream.Transport{}}
	h.rp = &httputil.ReverseProxy{
		Rewrite:    h.rewrite,
		Transport:  h.tr,
		BufferPool: &upstream.BufferPool{},
		// FlushInterval stays zero: ReverseProxy flushes an event stream (or
		// a body of unknown length) after every write anyway, and a plain
		// answer then leaves in one write with its headers. A negative one
		// would start a goroutine per response that sends the headers ahead.
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.upstreamError,
		ErrorLog:       slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/{path...}", h.serveAPI)
	mux.HandleFunc("GET /v1/models", h.serveModels)
	mux.HandleFunc("GET /v1/models/{id...}", h.serveModel)
	mux.HandleFunc("GET /status", h.serveStatus)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, map[string]string{"status": "ok"}) })
	h.mux = mux
	return h
}

// Handle adds another route (such as /metrics).
func (h *Handler) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

// ServeHTTP serves r through the mux, whose 404 and 405 are OpenAI-shaped.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { openai.ServeMux(h.mux, w, r) }

// Close closes the idle connections to hosts and stops their sweep. Call it
// once the server has stopped.
func (h *Handler) Close() { h.tr.Close() }

// attempt is one try of a request on one host, carried in the outgoing
// request's context through the ReverseProxy callbacks.
type attempt struct {
	host *host
	id   string // request id, forwarded
	body []byte
	root string // the model's profile id on host
	// observe: the time to first byte is a sample of the host's queue wait
	// (a stream to an awake copy; a load would only blur it).
	observe bool
	last    bool // no host is tried after this one
	start   time.Time
	now     func() time.Time

	first  time.Time // first response byte sent
	status int       // answered with; 0 when retried or the client left
	retry  string    // why the next host is tried ("connect", "unavailable"); "" when not
}

type attemptKey struct{}

// errRetry turns a 503 into a retry on the next host.
var errRetry = errors.New("host unavailable: retrying on the next host")

func (a *attempt) markFirst() {
	a.first = a.now()
	if a.observe {
		a.host.observeWait(a.root, a.first.Sub(a.start), a.first)
	}
}

// serveAPI forwards POST /v1/* to the best host for the body's model, trying
// the next best on a connect failure or a 503.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request) {
	start := h.fleet.opts.Now()
	id := openai.RequestID(r, "fleetd", &h.seq)
	log := make([]slog.Attr, 0, 12) // the access log line's attributes
	log = append(log, slog.String("requestId", id), slog.String("path", r.URL.Path))
	hostName, model, status := "none", "", 0
	var cur *attempt // the attempt under way; a broken stream unwinds from it with a panic
	defer func() {
		if cur != nil {
			hostName, status = cur.host.name, cur.status
			log = append(log, slog.Bool("aborted", true)) // the stream broke off after its first bytes
		}
		if status == 0 {
			status = 499 // the client left before an answer
		}
		h.fleet.metrics.request(hostName, model, status)
		if h.opts.AccessLog != nil {
			log = append(log, slog.String("host", hostName), slog.Int("status", status), slog.Int64("durationMs", h.fleet.opts.Now().Sub(start).Milliseconds()))
			h.opts.AccessLog.LogAttrs(r.Context(), slog.LevelInfo, "request", log...)
		}
	}()
	fail := func(code int, errCode, param, msg string) {
		status = code
		w.Header().Set("X-Request-Id", id)
		openai.WriteError(w, code, errCode, param, msg)
	}

	w.Header().Set("X-Request-Id", id)
	body, req, code := openai.ReadRequest(w, r, h.opts.MaxBodyBytes)
	if code != 0 {
		status = code
		return
	}
	name, stream := req.Model, req.Stream
	log = append(log, slog.String("model", name), slog.Bool("stream", stream))

	hosts := h.fleet.snapshot()
	views, known := h.fleet.views(hosts, name)
	if !known {
		fail(http.StatusNotFound, "model_not_found", "model", h.unknownModel(hosts, name))
		return
	}
	model = name
	order := Route(views, h.affinityKey(r, body), RouteOptions{ScaleOutWait: h.opts.ScaleOutWait, Slack: h.opts.LoadSlack})
	if len(order) == 0 {
		status = http.StatusServiceUnavailable
		w.Header().Set("X-Request-Id", id)
		openai.WriteUnavailable(w, "no_healthy_host", fmt.Sprintf("no healthy host can serve model %q now", name), 5*time.Second)
		return
	}
	h.fleet.metrics.decision(order[0].Reason)
	log = append(log, slog.String("reason", order[0].Reason), slog.String("tier", order[0].Rank.String()))
	n := min(len(order), h.opts.MaxAttempts)
	var tried []string
	for i, c := range order[:n] {
		hs := hosts[c.Host]
		a := &attempt{host: hs, id: id, body: body, root: rootOf(views, c.Host), observe: stream && c.Rank == placement.Awake,
			last: i == n-1, start: h.fleet.opts.Now(), now: h.fleet.opts.Now}
		tried = append(tried, c.Host)
		cur = a
		h.forward(w, r, a)
		cur = nil
		hostName, status = c.Host, a.status
		if a.retry == "" {
			if !a.first.IsZero() {
				log = append(log, slog.Int64("ttfbMs", a.first.Sub(start).Milliseconds()))
			}
			break
		}
		h.fleet.metrics.retry(c.Host, a.retry)
		h.log.Info("retrying on the next host", "requestId", id, "host", c.Host, "cause", a.retry)
	}
	if len(tried) > 1 {
		log = append(log, slog.Any("tried", tried))
	}
}

// forward makes one attempt, counted in flight to its host meanwhile.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, a *attempt) {
	a.host.addLocal(a.root, 1)
	defer a.host.addLocal(a.root, -1) // also when a broken stream panics out
	h.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), attemptKey{}, a)))
}

func rootOf(views []HostView, host string) string {
	i := slices.IndexFunc(views, func(v HostView) bool { return v.Name == host })
	return views[i].Root
}

// rewrite builds the request to a host: its URL, the body read once, the
// request id. Everything else, Authorization included, goes as the client
// sent it.
func (h *Handler) rewrite(pr *httputil.ProxyRequest) {
	a := pr.In.Context().Value(attemptKey{}).(*attempt)
	pr.SetURL(a.host.base)
	out := pr.Out
	upstream.SetBody(out, a.body)
	out.Header.Set("X-Request-Id", a.id)
}

// modifyResponse turns a 503 into a retry unless this is the last attempt,
// names the host in X-Fleet-Host, and wraps the body to see its first byte
// (and to end a broken event stream with an error event).
func (h *Handler) modifyResponse(resp *http.Response) error {
	a := resp.Request.Context().Value(attemptKey{}).(*attempt)
	h.fleet.forwarded(a.host, nil)
	if resp.StatusCode == http.StatusServiceUnavailable && !a.last {
		a.retry = "unavailable"
		return errRetry
	}
	a.status = resp.StatusCode
	resp.Header.Set("X-Fleet-Host", a.host.name)
	resp.Header.Del("X-Request-Id") // the answer has it already; poold's would be a second copy
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = openai.NewSSEReader(resp.Body, false, a.markFirst)
	} else {
		resp.Body = &firstByteReader{ReadCloser: resp.Body, onFirst: a.markFirst}
	}
	return nil
}

// upstreamError handles an attempt that got no response: the host is
// skipped for the next one, or, on the last attempt, the client gets a 502.
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errRetry) || r.Context().Err() != nil {
		return // a 503 to retry, or the client left
	}
	a := r.Context().Value(attemptKey{}).(*attempt)
	h.fleet.forwarded(a.host, err)
	h.log.Warn("host request failed", "host", a.host.name, "requestId", a.id, "err", err)
	if !a.last {
		a.retry = "connect"
		return
	}
	a.status = http.StatusBadGateway
	w.Header().Set("X-Fleet-Host", a.host.name)
	w.Header().Set("X-Request-Id", a.id)
	openai.WriteError(w, a.status, "host_unavailable", "", fmt.Sprintf("host %q failed: %v", a.host.name, err))
}

// firstByteReader calls onFirst when the first bytes are read.
type firstByteReader struct {
	io.ReadCloser
	onFirst func()
}

func (f *firstByteReader) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if n > 0 && f.onFirst != nil {
		f.onFirst()
		f.onFirst = nil
	}
	return n, err
}

// affinityKey is the client's session header, or else the first bytes of the
// first message, the prompt or the input.
func (h *Handler) affinityKey(r *http.Request, body []byte) string {
	if v := r.Header.Get(h.opts.AffinityHeader); v != "" {
		return "session:" + v
	}
	// The body is valid JSON (ReadRequest checked it): walk it rather than
	// decode it, which would cost as much as the rest of the forward.
	var p []byte
	if first := openai.FirstElement(openai.Member(body, "messages")); first != nil {
		p = openai.Member(first, "content")
	} else if p = openai.Member(body, "prompt"); p == nil {
		p = openai.Member(body, "input")
	}
	return "prefix:" + string(p[:min(len(p), h.opts.AffinityBytes)])
}

// maxListed bounds the names listed in a 404.
const maxListed = 50

func (h *Handler) unknownModel(hosts map[string]*host, name string) string {
	names := modelNames(hosts)
	more := ""
	if len(names) > maxListed {
		more = fmt.Sprintf(" and %d more", len(names)-maxListed)
		names = names[:maxListed]
	}
	return fmt.Sprintf("model %s does not exist on any host; available models: %s%s", strconv.Quote(name), strings.Join(names, ", "), more)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
