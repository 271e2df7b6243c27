package fleet

import (
	"context"
	"encoding/json"
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

// waitWindow is how long an observed queue wait stays meaningful without a
// new observation.
const waitWindow = 30 * time.Second

// waitAlpha is the weight of a new observation in the moving average.
const waitAlpha = 0.3

// waitEstimate is a moving average of the time to first byte of one model's
// streams on one host.
type waitEstimate struct {
	avg  time.Duration
	last time.Time // of the last observation
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
	// polled is set once a poll has succeeded: before that fleetd knows
	// nothing to route by.
	polled      bool
	reachable   bool // the last poll succeeded
	ejected     bool
	pollFails   int // consecutive failed polls
	fwdFails    int // consecutive failed forwards
	lastPoll    time.Time
	pollLatency time.Duration
	lastErr     string
	status      hostStatus
	models      map[string]hostModel    // by id and alias
	local       map[string]int          // root → this fleetd's requests in flight there
	waits       map[string]waitEstimate // root → observed stream TTFB
}

func newHost(spec HostSpec, source string) (*host, error) {
	u, err := url.Parse(strings.TrimSuffix(spec.URL, "/"))
	if err != nil {
		return nil, fmt.Errorf("host %q: url: %w", spec.Name, err)
	}
	return &host{name: spec.Name, spec: spec, source: source, base: u, done: make(chan struct{}), kick: make(chan struct{}, 1),
		local: make(map[string]int), waits: make(map[string]waitEstimate)}, nil
}

// healthy reports whether requests may be routed to the host.
func (h *host) healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.polled && !h.ejected
}

// poke asks the poller to poll at once.
func (h *host) poke() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run polls the host every interval until ctx ends; while the host is ejected
// the probes back off, doubling from interval up to the fleet's maximum.
func (f *Fleet) run(ctx context.Context, h *host) {
	defer close(h.done)
	t := time.NewTimer(0)
	defer t.Stop()
	backoff := f.opts.PollInterval
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.kick:
		}
		f.poll(ctx, h)
		if ctx.Err() != nil {
			return
		}
		next := f.opts.PollInterval
		h.mu.Lock()
		if h.ejected {
			next = backoff
			backoff = min(2*backoff, f.opts.MaxBackoff)
		} else {
			backoff = f.opts.PollInterval
		}
		h.mu.Unlock()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// poll reads the host's /status and /v1/models once and records the result.
func (f *Fleet) poll(ctx context.Context, h *host) {
	pctx, cancel := context.WithTimeout(ctx, f.opts.PollTimeout)
	defer cancel()
	start := f.opts.Now()
	var st hostStatus
	var models struct {
		Data []hostModel `json:"data"`
	}
	err := f.getJSON(pctx, h.base.JoinPath("status"), &st)
	if err == nil {
		err = f.getJSON(pctx, h.base.JoinPath("v1", "models"), &models)
	}
	took := f.opts.Now().Sub(start)
	if ctx.Err() != nil {
		return // fleetd is stopping or the host was removed
	}
	f.metrics.poll(h.name, took, err == nil)

	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastPoll, h.pollLatency = start, took
	if err != nil {
		h.reachable = false
		h.pollFails++
		h.lastErr = err.Error()
		if !h.ejected && h.pollFails >= f.opts.EjectAfter {
			f.ejectLocked(h, "poll", err)
		}
		return
	}
	if !h.polled || h.ejected {
		f.metrics.setUp(h.name, true)
	}
	if h.ejected {
		h.fwdFails = 0
		f.log.Info("host re-admitted", "host", h.name)
	}
	h.reachable, h.polled, h.ejected, h.pollFails, h.lastErr = true, true, false, 0, ""
	h.status = st
	h.models = make(map[string]hostModel, len(models.Data))
	for _, m := range models.Data {
		if m.Root == "" {
			m.Root = m.ID
		}
		h.models[m.ID] = m
	}
}

// ejectLocked takes h out of routing; h.mu is held.
func (f *Fleet) ejectLocked(h *host, cause string, err error) {
	h.ejected = true
	f.metrics.setUp(h.name, false)
	f.metrics.eject(h.name, cause)
	f.log.Warn("host ejected", "host", h.name, "cause", cause, "pollFailures", h.pollFails, "forwardFailures", h.fwdFails, "err", err)
}

// forwarded records the outcome of one forward to h: err is nil when the host
// answered. EjectAfter failures in a row eject the host.
func (f *Fleet) forwarded(h *host, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.fwdFails = 0
		return
	}
	h.fwdFails++
	h.lastErr = err.Error()
	if !h.ejected && h.fwdFails >= f.opts.EjectAfter {
		f.ejectLocked(h, "forward", err)
	}
	h.poke()
}

// addLocal counts a request of this fleetd for root in flight to h (delta ±1).
func (h *host) addLocal(root string, delta int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.local[root] += delta; h.local[root] <= 0 {
		delete(h.local, root)
	}
}

// observeWait folds a stream's time to first byte into root's estimate.
func (h *host) observeWait(root string, d time.Duration, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.waits[root]
	if now.Sub(w.last) > waitWindow {
		w.avg = d
	} else {
		w.avg = time.Duration(waitAlpha*float64(d) + (1-waitAlpha)*float64(w.avg))
	}
	w.last = now
	h.waits[root] = w
}

// view returns the routing input for model on h, and whether h knows the name.
func (h *host) view(model string, now time.Time) (HostView, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.models[model]
	if !ok {
		return HostView{}, false
	}
	v := HostView{Name: h.name, Weight: h.spec.Weight, Root: m.Root, Eligible: m.Pools, Local: maps.Clone(h.local)}
	if w := h.waits[m.Root]; now.Sub(w.last) <= waitWindow {
		v.Wait = w.avg
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
		for prof, n := range p.Waiting {
			pv.Waiting += n
			if n > 0 {
				pv.Queued = append(pv.Queued, prof)
			}
		}
		for _, s := range p.Sleeping {
			pv.Sleeping = append(pv.Sleeping, s.Profile)
		}
		v.Pools[i] = pv
	}
	return v, true
}

// maxStatusBytes bounds a host's /status or /v1/models body.
const maxStatusBytes = 8 << 20

func (f *Fleet) getJSON(ctx context.Context, u *url.URL, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if f.opts.PollKey != "" {
		req.Header.Set("Authorization", "Bearer "+f.opts.PollKey)
	}
	resp, err := f.opts.Client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %s", u, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatusBytes)).Decode(v); err != nil {
		return fmt.Errorf("GET %s: decoding: %w", u, err)
	}
	return nil
}
