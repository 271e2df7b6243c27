package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pipeline"
	"github.com/poold/poold/internal/placement"
	"github.com/poold/poold/internal/record"
	"github.com/poold/poold/internal/tenant"
	"github.com/poold/poold/internal/upstream"
)

// Defaults for HandlerOptions' zero values.
const (
	DefaultMaxAttempts    = 3
	DefaultAffinityHeader = "X-Session-Id"
	DefaultAffinityBytes  = 512
	// DefaultLoadSlack and DefaultAffinityEpsilon are the affinity bounds
	// fleetd's command line uses unless told otherwise (the zero
	// HandlerOptions values bound affinity to the least load).
	DefaultLoadSlack       = 1
	DefaultAffinityEpsilon = 0.25
	DefaultClaimLease      = 5 * time.Second
	DefaultClaimTimeout    = 250 * time.Millisecond
	// DefaultScaleOutCooldown is the least time between two scale-outs of
	// one model by one fleetd; each fleetd draws a factor in [1, 2) for it.
	DefaultScaleOutCooldown = 30 * time.Second
	// DefaultStreamIdleTimeout is fleetd's stream-idle-timeout: longer than
	// poold's own (2m), so that a poold whose engine stalls ends the stream
	// first, with its engine_timeout, and restarts the engine.
	DefaultStreamIdleTimeout = 3 * time.Minute
)

// HandlerOptions configures a Handler. Zero values: MaxBodyBytes →
// openai.DefaultMaxBodyBytes; MaxEventBytes → openai.DefaultMaxEvent;
// MaxAttempts → DefaultMaxAttempts;
// AffinityHeader → DefaultAffinityHeader; AffinityBytes → DefaultAffinityBytes;
// ScaleOut → off; ClaimLease → DefaultClaimLease;
// ScaleOutCooldown → DefaultScaleOutCooldown; Claims → this fleetd's own
// only; ClaimTimeout → DefaultClaimTimeout; Tenants → none (no key
// required, no limits); Logger → discard; AccessLog → none.
type HandlerOptions struct {
	MaxBodyBytes int64
	// MaxEventBytes bounds one server-sent event of a stream (larger ends
	// the stream with an error event).
	MaxEventBytes int64
	// StreamIdleTimeout bounds a host's silence within an answer: a stream
	// that completes no event for that long, or a plain body that sends no
	// byte, ends (a stream with a host_timeout error event) and counts as
	// the host's failure. Zero: no bound.
	StreamIdleTimeout time.Duration
	// MaxAttempts bounds the hosts one request is tried on: the next host is
	// tried only when the last could not be reached, went silent, refused
	// the key, or refused the request before starting anything (poold's
	// X-Poold-Refused), and never once a response byte reached the client.
	MaxAttempts int
	// AffinityHeader carries a client's session key; requests without it are
	// keyed by the first AffinityBytes bytes of their first message (or
	// prompt, or input), so that a shared system prompt keeps hitting one
	// host's prefix cache.
	AffinityHeader string
	AffinityBytes  int
	// AffinityEpsilon and LoadSlack are RouteOptions.Epsilon and Slack: a
	// key stays on its host while that host's load is within
	// (1+AffinityEpsilon)× the mean, or within LoadSlack of the least.
	AffinityEpsilon float64
	LoadSlack       int
	// ScaleOut: when every awake copy of a model is saturated (Options.
	// Saturation), no copy is loading, fewer than the model's maxCopies are
	// awake, and an idle, empty or asleep eligible pool exists on another
	// host, a request goes there, which loads another copy.
	ScaleOut bool
	// ScaleOutCooldown is the least time between two scale-outs of a model
	// by this fleetd, times a factor in [1, 2) drawn once per fleetd.
	ScaleOutCooldown time.Duration
	// Claims, when set, is shared by the replicas of fleetd (Redis): a new
	// copy of a model (a cold load or a scale-out) is claimed there, so that
	// the replicas load one copy, not one each.
	Claims Claims
	// ClaimLease is how long a claim of a model's new copy stands: the
	// requests for the model that follow go to the claimed host until the
	// polls show the copy loading there.
	ClaimLease time.Duration
	// ClaimTimeout bounds one claim in Claims; past it, or on any error,
	// the claim is taken for this fleetd alone.
	ClaimTimeout time.Duration
	// Tenants, when set, is the tenants file fleetd enforces before it asks
	// any host: a key of a tenant on every API request (401), the tenant's
	// rate limits (429), its models (the others do not exist for it: 404)
	// and its output cap (400, or the cap added); the tokens each request
	// used are debited when it ends.
	Tenants   *Tenants
	Version   string
	Logger    *slog.Logger
	AccessLog *slog.Logger
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
	// root serves the API (pipeline.Router) and the mux, with 404 and 405
	// in poold's shape, behind the tenants' gate when there is one.
	root  http.Handler
	gate  *tenant.Gate   // nil: no tenants file
	gates pipeline.Gates // the checks of an API request before any host is asked
	seq   atomic.Uint64  // request ids
	// claims are the new copies claimed by this fleetd, or learnt from
	// opts.Claims; scaledOut the models it scaled out, for their cool-down
	// (cooldown: ScaleOutCooldown times this fleetd's jitter).
	claims, scaledOut localClaims
	cooldown          time.Duration
	// claiming serialises the claims that go to opts.Claims, so that the
	// requests of a burst wait for the first one's answer from the shared
	// store instead of following this fleetd's own guess.
	claiming sync.Mutex
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
	if opts.ClaimLease <= 0 {
		opts.ClaimLease = DefaultClaimLease
	}
	if opts.ScaleOutCooldown <= 0 {
		opts.ScaleOutCooldown = DefaultScaleOutCooldown
	}
	if opts.ClaimTimeout <= 0 {
		opts.ClaimTimeout = DefaultClaimTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{fleet: f, opts: opts, log: opts.Logger.With("component", "router"), tr: &upstream.Transport{BodyIdleTimeout: opts.StreamIdleTimeout},
		cooldown: time.Duration(float64(opts.ScaleOutCooldown) * jitter())}
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
	// Every POST under /v1/ is served by h.router before the mux sees it;
	// the pattern stays for the mux's 405s, which name POST on those paths.
	mux.HandleFunc("POST /v1/{path...}", h.serveAPI)
	mux.HandleFunc("GET /v1/models", h.serveModels)
	mux.HandleFunc("GET /v1/models/{id...}", h.serveModel)
	mux.HandleFunc("GET /status", h.serveStatus)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, map[string]string{"status": "ok"}) })
	h.mux = mux
	h.root = &pipeline.Router{Mux: mux, API: http.HandlerFunc(h.serveAPI), IsAPI: func(path string) bool { return strings.HasPrefix(path, "/v1/") }}
	if opts.Tenants != nil {
		h.gate = opts.Tenants.gate
		h.root = h.gate.Require(h.root)
	}
	h.gates = pipeline.Gates{Tenants: h.gate, MaxBodyBytes: opts.MaxBodyBytes}
	return h
}

// Handle adds another route (such as /metrics).
func (h *Handler) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

// ServeHTTP serves r through the mux (behind the tenants' gate when there
// is one), whose 404 and 405 are in poold's shape (openai.WriteError).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.root.ServeHTTP(w, r) }

// Close closes the idle connections to hosts and stops their sweep. Call it
// once the server has stopped.
func (h *Handler) Close() { h.tr.Close() }

// attempt is one try of a request on one host, carried in the outgoing
// request's context through the ReverseProxy callbacks.
type attempt struct {
	host   *host
	id     string // request id, forwarded
	body   []byte
	root   string          // the model's profile id on host
	cred   string          // the client's credential hashed, "none" without one
	client context.Context // the client's request context
	// cancel ends the attempt with a cause (errSilent: the host went silent).
	cancel context.CancelCauseFunc
	// nextAny and nextWarm report whether another host may be tried after
	// this one: any host, or one where the model is awake or loading.
	nextAny, nextWarm bool
	trial             bool // the first answer for root on host after an ejection
	// meter: the answer's usage is read (the tenant's tokens are debited),
	// and withhold: the usage-only chunk of the stream is dropped (fleetd
	// asked for it, not the client); limited: fleetd set the
	// x-ratelimit-* headers, which the host's do not replace.
	meter, withhold, limited bool
	// anthropic: the request is the Messages route's, whose stream ends
	// with Anthropic's error event when the host breaks it off.
	anthropic bool
	start     time.Time
	now       func() time.Time

	first   time.Time // first response byte sent
	status  int       // answered with; 0 when retried or the client left
	retry   string    // why the next host is tried; "" when not
	cut     bool      // the answer broke off before its end, by the host's fault
	settled bool      // the outcome is folded into the host's health
	// sse and tail read a metered answer's usage: a stream's or a JSON body's.
	sse  *openai.SSEReader
	tail *openai.UsageReader
	// prompt is fleetd's estimate of a metered body's prompt tokens
	// (openai.EstimatePromptTokens), debited for a 2xx answer whose usage
	// fleetd cannot read.
	prompt int
}

type attemptKey struct{}

// errRetry turns an answer into a retry on the next host.
var errRetry = errors.New("host refused before starting anything: retrying on the next host")

// settle folds the attempt's outcome into its host's health, once.
func (a *attempt) settle(f *Fleet, o outcome) {
	if !a.settled {
		a.settled = true
		f.outcome(a.host, a.root, o, a.trial)
	}
}

// serveAPI forwards POST /v1/* to the best host for the body's model, trying
// the next best when the last one could not take it (see HandlerOptions.MaxAttempts).
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request) {
	start := h.fleet.opts.Now()
	id := openai.RequestID(r, "fleetd", &h.seq)
	log := make([]slog.Attr, 0, 16) // the access log line's attributes
	log = append(log, slog.String(record.FieldRequestID, id), slog.String(record.FieldPath, r.URL.Path))
	ten := tenant.FromContext(r.Context()) // nil without a tenants file
	if ten != nil {
		log = append(log, slog.String(record.FieldTenant, ten.Name))
	}
	hostName, model, status, cut := "none", "", 0, false
	var held []*host  // hosts tried, released once the request is counted
	var cur *attempt  // the attempt under way; a broken stream unwinds from it with a panic
	var last *attempt // the last attempt made: its answer's tokens settle the reservation
	reserved := 0     // the tokens reserved against the tenant's limit, settled at the end
	defer func() {
		if cur != nil {
			hostName, status, cut = cur.host.name, cur.status, cur.cut
			log = append(log, slog.Bool(record.FieldAborted, true)) // the stream broke off after its first bytes
		}
		if status == 0 {
			status = 499 // the client left before an answer
		}
		h.fleet.metrics.request(hostName, model, status, cut)
		if ten != nil {
			u, estimated := last.usage()
			h.gate.Settle(ten, reserved, u.PromptTokens+u.CompletionTokens)
			h.fleet.metrics.tenantRequest(ten.Name, status, cut, u.PromptTokens, u.CompletionTokens)
			if u != (openai.Usage{}) {
				log = append(log, slog.Int(record.FieldPromptTokens, u.PromptTokens), slog.Int(record.FieldCompletionTokens, u.CompletionTokens))
				if estimated {
					log = append(log, slog.Bool(record.FieldTokensEstimated, true))
				}
			}
		}
		for _, hs := range held {
			h.fleet.release(hs)
		}
		if openai.ClientStalled(w) {
			// Cut by openai.WriteDeadline: the host's request is cancelled.
			log = append(log, slog.Bool(record.FieldClientStalled, true))
			h.log.Info("client stopped reading: answer cut", "request_id", id, "host", hostName, "setting", openai.ClientWriteTimeoutSetting)
		}
		if h.opts.AccessLog != nil {
			if cut {
				log = append(log, slog.Bool(record.FieldCut, true))
			}
			log = append(log, slog.String(record.FieldHost, hostName), slog.Int(record.FieldStatus, status), slog.Int64(record.FieldDurationMs, h.fleet.opts.Now().Sub(start).Milliseconds()))
			h.opts.AccessLog.LogAttrs(r.Context(), slog.LevelInfo, record.Message, log...)
		}
	}()
	fail := func(code int, errCode, param, msg string) {
		status = code
		w.Header().Set("X-Request-Id", id)
		openai.WriteError(w, r, code, errCode, param, msg)
	}

	w.Header().Set("X-Request-Id", id)
	// A tenant's request goes through its limits, its models and its output
	// cap, in poold's order (pipeline.Gates), before any host is asked: a
	// refused request costs no host anything. The limits come first, before
	// the body is read, and the reservation of its worst case in tokens last.
	in, refused := h.gates.Read(w, r, ten, r.URL.Path)
	if refused.Refused() {
		status = refused.Status
		return
	}
	req := in.Read
	name, stream := req.Model, req.Stream
	log = append(log, slog.String(record.FieldModel, name), slog.Bool(record.FieldStream, stream))

	hosts := h.fleet.snapshot()
	cred := credential(r)
	views, known := h.fleet.views(hosts, name, cred, ten)
	if !known {
		fail(http.StatusNotFound, "model_not_found", "model", h.unknownModel(hosts, name, ten))
		return
	}
	model = name
	// A tenant's request is metered: its worst case is reserved from the
	// tenant's tokens once it is capped, and settled with its usage when
	// the answer ends; a stream that did not ask for usage is asked, as
	// poold asks its engine, and the usage chunk withheld from the client.
	meter, prompt := ten != nil, 0
	if refused := h.gates.Prepare(w, r, &in, pipeline.Changes{Meter: meter}); refused.Refused() {
		status = refused.Status
		return
	}
	body := in.Body
	if meter {
		prompt = openai.EstimatePromptTokens(body, req)
	}
	if refused := h.gates.Reserve(w, r, &in, 0); refused.Refused() {
		status = refused.Status
		return
	}
	reserved = in.Reserved
	ropts := h.fleet.routeOptions(start)
	ropts.Epsilon, ropts.Slack = h.opts.AffinityEpsilon, h.opts.LoadSlack
	if len(views) > 0 {
		// Not while cooling down after this fleetd's last scale-out of the
		// model.
		ropts.ScaleOut = h.opts.ScaleOut && h.scaledOut.held(views[0].Root, start) == ""
		ropts.MaxCopies = h.fleet.model(name, views[0].Root).MaxCopies
	}
	order := Route(views, h.affinityKey(r, body), ropts)
	if len(order) == 0 {
		status = http.StatusServiceUnavailable
		w.Header().Set("X-Request-Id", id)
		openai.WriteUnavailable(w, r, "no_healthy_host", fmt.Sprintf("no healthy host can serve model %q now", name), 5*time.Second)
		return
	}
	order = h.claimCopy(r.Context(), order, views)
	h.fleet.metrics.decision(order[0].Reason)
	log = append(log, slog.String(record.FieldReason, order[0].Reason), slog.String(record.FieldTier, order[0].Rank.String()))
	if order[0].Saturated {
		log = append(log, slog.Bool(record.FieldSaturated, true)) // every copy is
	}
	var tried []string
	warmOnly := false // after a full queue, only hosts where the model is awake or loading
	for i, c := range order {
		if len(tried) == h.opts.MaxAttempts {
			break
		}
		if warmOnly && c.Rank > placement.Loading {
			continue
		}
		left := h.opts.MaxAttempts - len(tried) - 1
		hs := hosts[c.Host]
		a := &attempt{host: hs, id: id, body: body, root: rootOf(views, c.Host), cred: cred, client: r.Context(),
			start: h.fleet.opts.Now(), now: h.fleet.opts.Now,
			meter: meter, withhold: in.InjectUsage, limited: meter && (ten.RPM > 0 || ten.TPM > 0), prompt: prompt, anthropic: openai.AnthropicRoute(r.URL.Path),
			nextAny:  left > 0 && slices.ContainsFunc(order[i+1:], func(n Choice) bool { return !warmOnly || n.Rank <= placement.Loading }),
			nextWarm: left > 0 && slices.ContainsFunc(order[i+1:], func(n Choice) bool { return n.Rank <= placement.Loading })}
		tried = append(tried, c.Host)
		held = append(held, hs)
		cur, last = a, a
		h.forward(w, r, a)
		cur = nil
		hostName, status = c.Host, a.status
		if a.retry == "" {
			if !a.first.IsZero() {
				log = append(log, slog.Int64(record.FieldTTFBMs, a.first.Sub(start).Milliseconds()))
			}
			break
		}
		warmOnly = warmOnly || a.retry == "full"
		h.fleet.metrics.retry(c.Host, a.retry)
		h.log.Info("retrying on the next host", "request_id", id, "host", c.Host, "reason", a.retry)
	}
	if len(tried) > 1 {
		log = append(log, slog.Any(record.FieldTried, tried))
	}
}

// forward makes one attempt, counted in flight to its host meanwhile.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, a *attempt) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	a.cancel = cancel
	a.trial = a.host.begin(a, a.start)
	defer func() { // also when a broken stream panics out
		a.host.end(a)
		a.settle(h.fleet, neutral)
	}()
	h.rp.ServeHTTP(w, r.WithContext(context.WithValue(ctx, attemptKey{}, a)))
}

func rootOf(views []HostView, host string) string {
	i := slices.IndexFunc(views, func(v HostView) bool { return v.Name == host })
	return views[i].Root
}

// credential returns the hash of the client's key (Authorization or
// X-Api-Key), or "none": hosts that refused it are tried last.
func credential(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if v == "" {
		v = r.Header.Get("X-Api-Key")
	}
	if v == "" {
		return "none"
	}
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:16])
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

// unknownModel is the message of a 404 for name: the models that exist (for
// t, nil for anyone).
func (h *Handler) unknownModel(hosts map[string]*host, name string, t *tenant.Tenant) string {
	names := modelNames(hosts, t)
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
