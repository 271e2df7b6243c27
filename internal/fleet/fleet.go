package fleet

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
	"github.com/poold/poold/internal/upstream"
)

// Defaults for Options' zero values.
const (
	DefaultPollInterval = time.Second
	// DefaultPollTimeout and DefaultSilentAfter find a silent host (a
	// stopped process, a dead link that drops packets) within about
	// DefaultPollInterval + 2×DefaultPollTimeout, 2.5 s.
	DefaultPollTimeout = 750 * time.Millisecond
	DefaultSilentAfter = 2
	DefaultEjectAfter  = 3
	DefaultMaxBackoff  = 30 * time.Second
	// DefaultEngineStatsMaxAge is the age past which an engine's sample is
	// ignored: poold samples every second, fleetd polls every second.
	DefaultEngineStatsMaxAge = 5 * time.Second
	// DefaultScaleInWindow is how long a model's copies must stay below
	// saturation before a copy loaded by scaling out is unloaded.
	DefaultScaleInWindow = 5 * time.Minute
)

// DefaultSaturation are the thresholds past which an awake copy is
// saturated: KV cache use above 85%, or more than 10 requests waiting.
var DefaultSaturation = Saturation{KVCacheUsage: 0.85, Waiting: 10}

// Options configures a Fleet. Zero values: Client → one on an
// upstream.Transport; Resolver → net.DefaultResolver; PollInterval →
// DefaultPollInterval; PollTimeout → DefaultPollTimeout; SilentAfter →
// DefaultSilentAfter; EjectAfter → DefaultEjectAfter; MaxBackoff →
// DefaultMaxBackoff; KeepSilent → false (cancel and retry); Saturation's
// thresholds → DefaultSaturation's; EngineStatsMaxAge →
// DefaultEngineStatsMaxAge; ScaleInWindow → DefaultScaleInWindow;
// AdminToken → none (scale-in cannot unload); Logger → discard; Metrics →
// none; Now → time.Now.
type Options struct {
	Client   *http.Client
	Resolver Resolver
	// PollInterval is how often each host's /status and /v1/models are read.
	PollInterval time.Duration
	// PollTimeout bounds one poll (both requests); a poll that times out is
	// followed by another at once.
	PollTimeout time.Duration
	// SilentAfter is how many polls in a row that time out eject a host as
	// silent.
	SilentAfter int
	// EjectAfter is how many failed polls, forwards that got no answer, or
	// failed answers of one model (5xx, cut streams) in a row eject the host,
	// or the model on the host.
	EjectAfter int
	// MaxBackoff caps an ejection's length: each lasts at least
	// PollInterval, and one soon after the last doubles it.
	MaxBackoff time.Duration
	// KeepSilent leaves the requests of a host ejected for silence waiting
	// there, instead of cancelling those that have no response byte yet and
	// retrying them on another host.
	KeepSilent bool
	// PollKey, when set, goes with every poll as "Authorization: Bearer": a
	// poold that requires API keys guards its /v1/models with them.
	PollKey string
	// Saturation says when an awake copy of a model is saturated (see
	// Route), and EngineStatsMaxAge when an engine's sample is too old to
	// say anything.
	Saturation        Saturation
	EngineStatsMaxAge time.Duration
	// ScaleInWindow is how long every awake copy of a model must stay
	// unsaturated before a copy this fleetd loaded by scaling out is
	// unloaded (one per window); a model's scaleInWindow in the hosts file
	// overrides it.
	ScaleInWindow time.Duration
	// AdminToken is the hosts' admin token (poold's admin-token), with which
	// fleetd unloads those copies; without it they stay loaded until their
	// hosts' schedulers give their pools to other work.
	AdminToken string
	Logger     *slog.Logger
	Metrics    *Metrics
	Now        func() time.Time
}

// Fleet is the set of hosts and what fleetd knows of them. Membership comes
// from the hosts file (Apply, LoadFile) and from the DNS names it lists; each
// host has one poller goroutine. Create it with New; it is safe for
// concurrent use.
type Fleet struct {
	opts Options
	// polls is the transport of the default poll client, closed when Run
	// ends; nil when Options gave a client.
	polls   *upstream.Transport
	log     *slog.Logger
	metrics *Metrics // nil: none
	// routing is a copy of hosts, replaced (never modified) each time hosts
	// changes, so that requests read the membership without mu or a copy of
	// their own; nil (no hosts) before the first change.
	routing atomic.Pointer[map[string]*host]
	// models are the hosts file's models by name, replaced (never
	// modified) when a file is applied; nil before.
	models atomic.Pointer[map[string]ModelSpec]
	// scale is what scale-in knows of the copies this fleetd loaded by
	// scaling out (runScaleIn).
	scale scaleIn

	mu sync.Mutex // guards every field below
	// ctx is Run's context; nil before Run, which starts what Apply set up.
	ctx   context.Context
	file  *File
	fstat statusapi.File
	// sources maps "file" and "dns:NAME" to the hosts each supplies.
	sources map[string][]HostSpec
	// dns maps a DNS entry (as formatted by dnsKey) to its discovery's cancel.
	dns   map[string]context.CancelFunc
	hosts map[string]*host
	// retiring holds the hosts that left the membership while the hosts
	// that came with them (awaiting) had no successful poll yet: they
	// still route, so that a model served before and after a change is
	// never unknown in between (retire.go).
	retiring map[string]*host
	awaiting map[*host]bool
	wg       sync.WaitGroup // pollers and discoveries
}

// New returns a Fleet with no hosts.
func New(opts Options) *Fleet {
	var polls *upstream.Transport
	if opts.Client == nil {
		polls = &upstream.Transport{}
		opts.Client = &http.Client{Transport: polls}
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.PollTimeout <= 0 {
		opts.PollTimeout = DefaultPollTimeout
	}
	if opts.SilentAfter <= 0 {
		opts.SilentAfter = DefaultSilentAfter
	}
	if opts.EjectAfter <= 0 {
		opts.EjectAfter = DefaultEjectAfter
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	if opts.Saturation.KVCacheUsage <= 0 {
		opts.Saturation.KVCacheUsage = DefaultSaturation.KVCacheUsage
	}
	if opts.Saturation.Waiting <= 0 {
		opts.Saturation.Waiting = DefaultSaturation.Waiting
	}
	if opts.EngineStatsMaxAge <= 0 {
		opts.EngineStatsMaxAge = DefaultEngineStatsMaxAge
	}
	if opts.ScaleInWindow <= 0 {
		opts.ScaleInWindow = DefaultScaleInWindow
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Fleet{opts: opts, polls: polls, log: opts.Logger.With("component", "fleet"), metrics: opts.Metrics,
		sources: make(map[string][]HostSpec), dns: make(map[string]context.CancelFunc), hosts: make(map[string]*host),
		retiring: make(map[string]*host), awaiting: make(map[*host]bool)}
}

// Run polls the hosts and resolves the DNS names until ctx ends, then waits
// for every goroutine it started.
func (f *Fleet) Run(ctx context.Context) {
	f.mu.Lock()
	f.ctx = ctx
	if f.file != nil {
		f.applyLocked(f.file)
	}
	f.mu.Unlock()
	f.wg.Go(func() { f.runScaleIn(ctx) })
	<-ctx.Done()
	f.wg.Wait()
	if f.polls != nil {
		f.polls.Close()
	}
}

// LoadFile reads, validates and applies the hosts file at path. A file that
// does not load changes nothing; its error is returned and shown in /status.
// A file whose content did not change is not applied again.
func (f *Fleet) LoadFile(path string) error {
	file, raw, err := LoadFile(path)
	sum := sha256.Sum256(raw)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		msg := err.Error()
		f.fstat.LastError = &msg
		f.metrics.reloaded(false)
		return err
	}
	f.metrics.reloaded(true)
	hash := hex.EncodeToString(sum[:])
	if f.fstat.SHA256 == hash && f.fstat.Path == path {
		if f.fstat.LastError != nil {
			f.log.Info("hosts file valid again; the hosts in force are unchanged", "path", path)
		}
		f.fstat.LastError = nil
		return nil
	}
	f.fstat = statusapi.File{Path: path, SHA256: hash, LoadedAt: f.opts.Now()}
	f.applyLocked(file)
	f.log.Info("hosts file loaded", "path", path, "hosts", len(file.Hosts), "dns", len(file.DNS))
	return nil
}

// WatchFile reloads the hosts file at path each time changes reports it may
// have changed, until changes is closed.
func (f *Fleet) WatchFile(path string, changes <-chan struct{}) {
	for range changes {
		if err := f.LoadFile(path); err != nil {
			f.log.Error("hosts file refused; keeping the hosts in force", "path", path, "err", err)
		}
	}
}

// Apply makes file's hosts and DNS names the fleet's membership.
func (f *Fleet) Apply(file *File) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applyLocked(file)
}

func (f *Fleet) applyLocked(file *File) {
	f.file = file
	models := make(map[string]ModelSpec, len(file.Models))
	for _, m := range file.Models {
		models[m.Name] = m
	}
	f.models.Store(&models)
	if f.ctx == nil {
		return // Run applies it
	}
	f.sources["file"] = file.Hosts
	keep := make(map[string]bool)
	for _, d := range file.DNS {
		key := dnsKey(d)
		keep[key] = true
		if _, ok := f.dns[key]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(f.ctx)
		f.dns[key] = cancel
		source := "dns:" + d.Name
		f.wg.Go(func() {
			f.discover(ctx, d, func(hosts []HostSpec) {
				f.mu.Lock()
				defer f.mu.Unlock()
				if ctx.Err() == nil {
					f.sources[source] = hosts
					f.reconcileLocked()
				}
			})
		})
	}
	for key, cancel := range f.dns {
		if !keep[key] {
			cancel()
			delete(f.dns, key)
		}
	}
	for source := range f.sources {
		if source != "file" && !slices.ContainsFunc(file.DNS, func(d DNSSpec) bool { return "dns:"+d.Name == source }) {
			delete(f.sources, source)
		}
	}
	f.reconcileLocked()
}

// dnsKey identifies a DNS entry: a changed entry restarts its discovery.
func dnsKey(d DNSSpec) string { return fmt.Sprintf("%+v", d) }

// reconcileLocked starts a poller for every new host, stops those of hosts
// gone, and updates the labels and weight of the others. Hosts from the file
// come first: a DNS host with the same name as another is ignored.
func (f *Fleet) reconcileLocked() {
	want := make(map[string]bool)
	sources := make([]string, 0, len(f.sources))
	for s := range f.sources {
		sources = append(sources, s)
	}
	slices.SortFunc(sources, func(a, b string) int {
		if (a == "file") != (b == "file") {
			if a == "file" {
				return -1
			}
			return 1
		}
		return cmp.Compare(a, b)
	})
	var gone, started []*host
	for _, source := range sources {
		for _, spec := range f.sources[source] {
			if want[spec.Name] {
				continue
			}
			want[spec.Name] = true
			h, ok := f.hosts[spec.Name]
			if r := f.retiring[spec.Name]; !ok && r != nil && r.spec.URL == spec.URL {
				delete(f.retiring, spec.Name) // back before it was retired
				f.hosts[spec.Name] = r
				h, ok = r, true
			}
			if ok && h.spec.URL == spec.URL {
				h.mu.Lock()
				h.spec, h.source = spec, source
				h.mu.Unlock()
				continue
			}
			if ok {
				delete(f.hosts, h.name)
				gone = append(gone, h)
			}
			if h := f.startLocked(spec, source); h != nil {
				started = append(started, h)
			}
		}
	}
	for name, h := range f.hosts {
		if !want[name] {
			delete(f.hosts, name)
			gone = append(gone, h)
		}
	}
	f.retireLocked(gone, started)
}

// startLocked starts a poller for a new host, and returns the host (nil
// when its spec is unusable).
func (f *Fleet) startLocked(spec HostSpec, source string) *host {
	h, err := newHost(spec, source)
	if err != nil {
		f.log.Error("host not added", "host", spec.Name, "err", err)
		return nil
	}
	ctx, cancel := context.WithCancel(f.ctx)
	h.stop = cancel
	f.hosts[spec.Name] = h
	f.metrics.setUp(spec.Name, false)
	f.log.Info("host added", "host", spec.Name, "url", spec.URL, "source", source)
	f.wg.Go(func() { f.run(ctx, h) })
	return h
}

// stopLocked stops the poller of h, which has left f.hosts and f.retiring;
// its series stay until the requests that tried it are counted (release),
// and those of a host of the same name in the fleet stay.
func (f *Fleet) stopLocked(h *host) {
	h.stop()
	delete(f.awaiting, h)
	h.mu.Lock()
	h.removed = true
	gone := h.refs == 0
	h.mu.Unlock()
	if _, back := f.hosts[h.name]; gone && !back {
		f.metrics.forget(h.name)
	}
	f.log.Info("host removed", "host", h.name)
}

// release ends one request's hold on h, taken by begin, once its outcome is
// counted; the last one on a removed host drops the host's series, unless a
// new host of the same name has taken them over.
func (f *Fleet) release(h *host) {
	h.mu.Lock()
	h.refs--
	gone := h.removed && h.refs == 0
	h.mu.Unlock()
	if !gone {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, back := f.hosts[h.name]; !back {
		f.metrics.forget(h.name)
	}
}

// snapshot returns the current hosts, in a map shared with every caller:
// read it, never modify it.
func (f *Fleet) snapshot() map[string]*host {
	if hosts := f.routing.Load(); hosts != nil {
		return *hosts
	}
	return nil
}

// views returns the routing input for model over the hosts where a request
// with credential hash cred (or "") may go, and whether any host, healthy
// or not, knows the name. For a tenant, a host where the name stands for a
// model the tenant may not use does not know it.
func (f *Fleet) views(hosts map[string]*host, model, cred string, t *tenant.Tenant) ([]HostView, bool) {
	now := f.opts.Now()
	var out []HostView
	known := false
	for _, h := range hosts {
		v, ok, routable := h.view(model, cred, now)
		if !ok || t != nil && !t.AllowsModel(model, v.Root) {
			continue
		}
		known = true
		if routable {
			out = append(out, v)
		}
	}
	return out, known
}

// model returns the copies' bounds of the model a request names, by that
// name or else by root, its profile id; a model the hosts file does not
// list gets the defaults (at least one copy, no most, fleetd's window).
func (f *Fleet) model(name, root string) ModelSpec {
	var m ModelSpec
	if models := f.models.Load(); models != nil {
		var ok bool
		if m, ok = (*models)[name]; !ok {
			m = (*models)[root]
		}
	}
	m.MinCopies = max(m.MinCopies, 1)
	if m.window <= 0 {
		m.window = f.opts.ScaleInWindow
	}
	return m
}

// routeOptions are the routing settings that come from the fleet's options,
// at now.
func (f *Fleet) routeOptions(now time.Time) RouteOptions {
	return RouteOptions{Saturation: f.opts.Saturation, StatsMaxAge: f.opts.EngineStatsMaxAge, Now: now}
}
