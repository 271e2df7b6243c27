package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// hostStatus is the part of poold's GET /status fleetd reads.
type hostStatus struct {
	Version string           `json:"version"`
	Host    string           `json:"host"`
	Pools   []statusapi.Pool `json:"pools"`
}

// hostModel is one entry of poold's GET /v1/models.
type hostModel struct {
	ID    string   `json:"id"`
	Root  string   `json:"root"` // the canonical profile id
	State string   `json:"state"`
	Pools []string `json:"pools"` // eligible pools; empty means all
	// MaxModelLen is the host's max_model_len for it; 0 when not given.
	MaxModelLen int `json:"max_model_len"`
}

// itlWindow is how long an observed inter-chunk gap stays meaningful
// without a new observation; past it a slow host is tried again like any
// other, which is how it is probed.
const itlWindow = 30 * time.Second

// itlAlpha is the weight of a new observation in the moving average.
const itlAlpha = 0.3

// keyRefusal is how long a host's 401 or 403 for a key steers that key's
// requests to other hosts; maxRefusals bounds the keys remembered per host.
const (
	keyRefusal  = time.Minute
	maxRefusals = 4096
)

// estimate is a moving average of one model's observations on one host:
// the gap between its streams' chunks.
type estimate struct {
	avg  time.Duration
	last time.Time // of the last observation
}

func (e *estimate) observe(d time.Duration, now time.Time) {
	if now.Sub(e.last) > itlWindow {
		e.avg = d
	} else {
		e.avg = time.Duration(itlAlpha*float64(d) + (1-itlAlpha)*float64(e.avg))
	}
	e.last = now
}

func (e estimate) value(now time.Time) time.Duration {
	if now.Sub(e.last) <= itlWindow {
		return e.avg
	}
	return 0
}

// host is one poold host: its spec, its poller and what the last polls and
// forwards said about it.
type host struct {
	name string   // spec.Name, which never changes
	base *url.URL // spec.URL parsed, which never changes: a new URL is a new host
	stop context.CancelFunc
	done chan struct{} // closed when the poller has returned
	kick chan struct{} // buffered(1): poll now

	mu sync.Mutex // guards every field below
	// spec is the host's entry; a reload changes its weight and labels,
	// holding the Fleet's mutex too, under which it may also be read.
	spec   HostSpec
	source string // "file" or "dns:NAME"
	// polled is set once a poll has success: before that fleetd knows
	// nothing to route by.
	polled      bool
	reachable   bool     // the last poll success
	eject       ejection // of the whole host: polls, silence or connections failed
	pollFails   int      // consecutive failed polls
	silentPolls int      // consecutive polls that timed out
	fwdFails    int      // consecutive forwards that got no answer
	lastPoll    time.Time
	pollLatency time.Duration
	lastErr     string
	status      hostStatus
	// clockSkew is the host's clock minus fleetd's at its last poll, from
	// the Date of its /status (to within half a second): what converts its
	// engines' sample times to fleetd's clock. Zero when it sent no Date.
	clockSkew time.Duration
	models    map[string]hostModel // by id and alias
	// local counts this fleetd's requests in flight there by root, and
	// atPoll what it counted when the last poll answered: local − atPoll is
	// what the poll cannot have seen.
	local, atPoll map[string]int
	itls          map[string]estimate     // root → gap between stream chunks
	health        map[string]*modelHealth // root → passive health
	refused       map[string]time.Time    // credential hash → end of its refusal
	// pending holds the attempts that have no response byte yet, which an
	// ejection for silence cancels to retry them elsewhere.
	pending map[*attempt]struct{}
	// refs counts the requests that tried the host and are not yet counted
	// in the metrics; removed is set when the host left the fleet, whose
	// series go once refs is 0.
	refs    int
	removed bool
}

func newHost(spec HostSpec, source string) (*host, error) {
	u, err := url.Parse(strings.TrimSuffix(spec.URL, "/"))
	if err != nil {
		return nil, fmt.Errorf("host %q: url: %w", spec.Name, err)
	}
	return &host{name: spec.Name, spec: spec, source: source, base: u, done: make(chan struct{}), kick: make(chan struct{}, 1),
		local: make(map[string]int), atPoll: make(map[string]int), itls: make(map[string]estimate),
		health: make(map[string]*modelHealth), refused: make(map[string]time.Time), pending: make(map[*attempt]struct{})}, nil
}

// healthyLocked reports whether requests may be routed to the host (a model
// of it may still be ejected); h.mu is held.
func (h *host) healthyLocked() bool { return h.polled && !h.eject.active() }

// healthy reports whether requests may be routed to the host.
func (h *host) healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthyLocked()
}

// poke asks the poller to poll at once.
func (h *host) poke() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run polls the host until ctx ends: every poll interval, at once after a
// poll that timed out (silence is found in two poll timeouts), and while
// the host is ejected at the ejection's end.
func (f *Fleet) run(ctx context.Context, h *host) {
	defer close(h.done)
	t := time.NewTimer(0)
	defer t.Stop()
	first := false // the host has had a successful poll
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.kick:
		}
		next := f.poll(ctx, h)
		if ctx.Err() != nil {
			return
		}
		if !first && h.healthy() {
			first = true
			f.polledOnce(h)
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// errSilent cancels the attempts of a host ejected for silence.
var errSilent = errors.New("host silent: its polls timed out")

// poll reads the host's /status and /v1/models once, records the result and
// returns the time until the next poll.
func (f *Fleet) poll(ctx context.Context, h *host) time.Duration {
	pctx, cancel := context.WithTimeout(ctx, f.opts.PollTimeout)
	defer cancel()
	start := f.opts.Now()
	var st hostStatus
	var models struct {
		Data []hostModel `json:"data"`
	}
	hostNow, err := f.getJSON(pctx, h.base.JoinPath("status"), &st)
	statusAt := f.opts.Now()
	if err == nil {
		_, err = f.getJSON(pctx, h.base.JoinPath("v1", "models"), &models)
	}
	if err == nil {
		err = checkBounds(len(st.Pools), len(models.Data))
	}
	now := f.opts.Now()
	took := now.Sub(start)
	if ctx.Err() != nil {
		return 0 // fleetd is stopping or the host was removed
	}
	f.metrics.poll(h.name, took, err == nil)

	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastPoll, h.pollLatency = start, took
	if err != nil {
		timedOut := errors.Is(pctx.Err(), context.DeadlineExceeded)
		h.reachable = false
		h.pollFails++
		if timedOut {
			h.silentPolls++
		} else {
			h.silentPolls = 0
		}
		if errors.Is(err, errTooLarge) && h.lastErr != err.Error() {
			f.log.Warn("host status refused", "host", h.name, "err", err)
		}
		h.lastErr = err.Error()
		switch {
		case h.eject.active():
		case timedOut && h.silentPolls >= f.opts.SilentAfter:
			f.ejectLocked(h, "silent", err, now)
		case h.pollFails >= f.opts.EjectAfter:
			f.ejectLocked(h, "poll", err, now)
		}
		if h.eject.active() {
			return max(h.eject.until.Sub(now), f.opts.PollInterval)
		}
		if timedOut {
			return 0
		}
		return f.opts.PollInterval
	}
	h.reachable, h.pollFails, h.silentPolls = true, 0, 0
	h.status, h.clockSkew = st, 0
	if !hostNow.IsZero() {
		h.clockSkew = hostNow.Add(time.Second / 2).Sub(statusAt) // Date has whole seconds
	}
	h.models = make(map[string]hostModel, len(models.Data))
	for _, m := range models.Data {
		if m.Root == "" {
			m.Root = m.ID
		}
		h.models[m.ID] = m
	}
	h.atPoll = maps.Clone(h.local)
	if h.eject.active() && !h.eject.over(now) {
		// Polls answer again, but the ejection lasts its length.
		return h.eject.until.Sub(now)
	}
	if !h.polled || h.eject.active() {
		f.metrics.setUp(h.name, true)
	}
	if h.eject.active() {
		h.fwdFails = 0
		h.eject.readmit(now)
		f.log.Info("host re-admitted", "host", h.name)
	}
	h.polled, h.lastErr = true, ""
	return f.opts.PollInterval
}

// ejectLocked takes h out of routing at now; h.mu is held. An ejection for
// silence cancels the attempts that have no response byte yet, unless
// Options.KeepSilent says not to: they are retried on another host.
func (f *Fleet) ejectLocked(h *host, cause string, err error, now time.Time) {
	h.eject.eject(now, f.opts.PollInterval, f.opts.MaxBackoff, cause, false)
	f.metrics.setUp(h.name, false)
	f.metrics.eject(h.name, cause)
	f.log.Warn("host ejected", "host", h.name, "reason", cause, "for", h.eject.length,
		"pollFailures", h.pollFails, "forwardFailures", h.fwdFails, "err", err)
	if cause == "silent" && !f.opts.KeepSilent {
		for a := range h.pending {
			a.cancel(errSilent)
		}
		clear(h.pending)
	}
}

// begin counts attempt a in flight to h and pending until its first byte,
// and reports whether it is the trial of a.root after an ejection.
func (h *host) begin(a *attempt, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.local[a.root]++
	h.refs++
	h.pending[a] = struct{}{}
	m := h.health[a.root]
	if m == nil {
		return false
	}
	if hs, ok := m.health(now); ok && hs == Trial {
		m.trialBusy = true
		return true
	}
	return false
}

// answered records that a's host sent a response byte: it is no longer
// cancelled by an ejection for silence.
func (h *host) answered(a *attempt) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.pending, a)
}

// end counts a out of flight.
func (h *host) end(a *attempt) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.pending, a)
	if h.local[a.root]--; h.local[a.root] <= 0 {
		delete(h.local, a.root)
	}
}

// forwarded records that a forward to h got an answer (err nil) or none.
// EjectAfter failures in a row eject the host; a failure polls it at once.
func (f *Fleet) forwarded(h *host, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.fwdFails = 0
		return
	}
	h.fwdFails++
	h.lastErr = err.Error()
	if !h.eject.active() && h.fwdFails >= f.opts.EjectAfter {
		f.ejectLocked(h, "connect", err, f.opts.Now())
	}
	h.poke()
}

// outcome folds what an answer says of root on h into its passive health;
// EjectAfter failures in a row, or a failed trial, eject the model there.
func (f *Fleet) outcome(h *host, root string, o outcome, trial bool) {
	now := f.opts.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.health[root]
	if m == nil {
		if o != failure && !trial {
			return // nothing to say of a model that never failed there
		}
		m = &modelHealth{halfStart: now}
		h.health[root] = m
	}
	if m.record(o, trial, now, f.opts.EjectAfter, f.opts.PollInterval, f.opts.MaxBackoff) {
		f.metrics.eject(h.name, "errors")
		f.log.Warn("model ejected on host", "host", h.name, "model", root, "for", m.eject.length, "failuresInARow", m.fails, "trial", trial)
	} else if trial && o == success {
		f.log.Info("model re-admitted on host", "host", h.name, "model", root)
	}
}

// refuseKey remembers that h refused the credential whose hash is cred.
func (h *host) refuseKey(cred string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.refused) >= maxRefusals {
		for k, until := range h.refused {
			if !now.Before(until) {
				delete(h.refused, k)
			}
		}
		if len(h.refused) >= maxRefusals {
			clear(h.refused)
		}
	}
	h.refused[cred] = now.Add(keyRefusal)
}

// observeITL folds d, a stream's mean gap between chunks, into root's
// estimate.
func (h *host) observeITL(root string, d time.Duration, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.itls[root]
	e.observe(d, now)
	h.itls[root] = e
}

// view returns the routing input for model on h for a request with
// credential hash cred (or ""), whether h knows the name, and whether the
// request may go there (the host and the model are not ejected). A view
// that is not routable carries only the model's Root.
func (h *host) view(model, cred string, now time.Time) (v HostView, known, routable bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.models[model]
	if !ok {
		return HostView{}, false, false
	}
	health := Healthy
	if mh := h.health[m.Root]; mh != nil {
		if health, ok = mh.health(now); !ok {
			return HostView{Root: m.Root}, true, false
		}
	}
	if !h.healthyLocked() {
		return HostView{Root: m.Root}, true, false
	}
	if h.silentPolls > 0 && health == Healthy {
		health = Degraded // its last poll timed out: it may have gone silent
	}
	if until, ok := h.refused[cred]; ok && cred != "" && now.Before(until) {
		health = KeyRefused
	}
	v = HostView{Name: h.name, Weight: h.spec.Weight, Root: m.Root, Eligible: m.Pools, Health: health, ITL: h.itls[m.Root].value(now)}
	for root := range h.local {
		v.Delta = addDelta(v.Delta, root, h.local[root]-h.atPoll[root])
	}
	for root, n := range h.atPoll {
		if _, ok := h.local[root]; !ok {
			v.Delta = addDelta(v.Delta, root, -n)
		}
	}
	v.Pools = make([]PoolView, len(h.status.Pools))
	for i, p := range h.status.Pools {
		pv := PoolView{Name: p.Name, State: string(p.State), GateClosed: p.Gate == "closed", InFlight: p.InFlight, LastUsed: p.LastUsed}
		if p.Profile != nil {
			pv.Profile = *p.Profile
		}
		if p.SwitchingTo != nil {
			pv.SwitchingTo = *p.SwitchingTo
		}
		for _, n := range p.Waiting {
			pv.Waiting += n
		}
		pv.Queued = p.Waiting
		for _, s := range p.Sleeping {
			pv.Sleeping = append(pv.Sleeping, s.Profile)
		}
		if e := p.EngineStats; e != nil {
			pv.Engine = &EngineLoad{Running: e.Running, Waiting: e.Waiting, KVCacheUsage: e.KVCacheUsage, SampledAt: e.SampledAt.Add(-h.clockSkew)}
		}
		v.Pools[i] = pv
	}
	return v, true, true
}

// addDelta records a non-zero d for root in m, made when first needed.
func addDelta(m map[string]int, root string, d int) map[string]int {
	if d == 0 {
		return m
	}
	if m == nil {
		m = make(map[string]int)
	}
	m[root] = d
	return m
}

// maxStatusBytes bounds a host's /status or /v1/models body; maxPools and
// maxModels the pools of its /status and the models of its /v1/models, far
// above any real host's (a pool per GPU, a few names per profile), so that
// a host cannot fill fleetd's memory, its routing and its /status.
const (
	maxStatusBytes = 8 << 20
	maxPools       = 256
	maxModels      = 4096
)

// errTooLarge is the error of a poll whose answers are over the bounds.
var errTooLarge = errors.New("over fleetd's bounds")

// checkBounds says whether a host's pools and models are within the bounds.
func checkBounds(pools, models int) error {
	switch {
	case pools > maxPools:
		return fmt.Errorf("%w: %d pools in /status, at most %d", errTooLarge, pools, maxPools)
	case models > maxModels:
		return fmt.Errorf("%w: %d models in /v1/models, at most %d", errTooLarge, models, maxModels)
	}
	return nil
}

// getJSON reads u into v, and returns the answer's Date (zero when it has
// none).
func (f *Fleet) getJSON(ctx context.Context, u *url.URL, v any) (time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return time.Time{}, fmt.Errorf("GET %s: %w", u, err)
	}
	if f.opts.PollKey != "" {
		req.Header.Set("Authorization", "Bearer "+f.opts.PollKey)
	}
	resp, err := f.opts.Client.Do(req)
	if err != nil {
		return time.Time{}, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Time{}, fmt.Errorf("GET %s: status %s", u, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatusBytes)).Decode(v); err != nil {
		return time.Time{}, fmt.Errorf("GET %s: decoding: %w", u, err)
	}
	date, _ := http.ParseTime(resp.Header.Get("Date"))
	return date, nil
}
