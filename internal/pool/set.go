package pool

import (
	"context"
	"errors"
	"time"

	"github.com/poold/poold/internal/profile"
)

// ErrNoPool is returned when a profile may not run on the pool asked for.
var ErrNoPool = errors.New("no such pool for this model")

// Set is every pool of a host. Its pool list is fixed at construction.
type Set struct {
	cfg   *profile.Config
	pools []*Pool
	by    map[string]*Pool
}

// NewSet builds one Pool per pool of cfg. Call Run to start them.
func NewSet(cfg *profile.Config, opts Options) *Set {
	s := &Set{cfg: cfg, by: make(map[string]*Pool, len(cfg.Pools))}
	for _, spec := range cfg.Pools {
		p := newPool(spec, cfg, opts)
		s.pools = append(s.pools, p)
		s.by[spec.Name] = p
	}
	return s
}

// Run starts every pool's loop (each preloads its default) and returns at once.
// When ctx ends, the pools stop their engines; Wait blocks until they have.
func (s *Set) Run(ctx context.Context) {
	for _, p := range s.pools {
		go p.run(ctx)
	}
}

// Wait blocks until every pool loop has stopped its engine and ended.
func (s *Set) Wait() {
	for _, p := range s.pools {
		<-p.done
	}
}

// Pool returns the named pool, or nil.
func (s *Set) Pool(name string) *Pool { return s.by[name] }

// Pools returns the pools in file order.
func (s *Set) Pools() []*Pool { return s.pools }

// Acquire places a request for prof on a pool and waits for its lease. A
// non-empty pin names the only pool allowed.
func (s *Set) Acquire(ctx context.Context, prof *profile.Profile, pin string) (*Lease, error) {
	if pin != "" {
		p := s.by[pin]
		if p == nil || !prof.EligibleOn(pin) {
			return nil, ErrNoPool
		}
		return p.Acquire(ctx, prof)
	}
	return s.place(prof).Acquire(ctx, prof)
}

// Placement ranks, best first.
const (
	rankReady   = iota // serving the profile with the gate open
	rankLoading        // loading it, or serving it behind a closed gate, or already queued for it
	rankEmpty          // no engine, nothing loading, nobody waiting
	rankIdle           // its loaded profile has no demand; least recently used first
	rankBusy           // everything else; shortest queue first
)

// candidate is one pool's answer to "how soon could you serve this profile".
type candidate struct {
	rank     int
	lastUsed time.Time
	load     int // in flight + waiting
}

func (c candidate) better(d candidate) bool {
	if c.rank != d.rank {
		return c.rank < d.rank
	}
	if c.rank == rankIdle && !c.lastUsed.Equal(d.lastUsed) {
		return c.lastUsed.Before(d.lastUsed)
	}
	return c.load < d.load
}

// place chooses the pool for prof among those it is eligible on: ready with it,
// then loading it, then empty, then the one whose profile is idle longest, then
// the shortest queue. It never starts a second copy while one exists or loads.
func (s *Set) place(prof *profile.Profile) *Pool {
	var best *Pool
	var bestC candidate
	for _, p := range s.pools {
		if !prof.EligibleOn(p.name) {
			continue
		}
		c := p.candidate(prof.ID)
		if best == nil || c.better(bestC) {
			best, bestC = p, c
		}
	}
	return best
}

func (p *Pool) candidate(id string) candidate {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.sched
	c := candidate{lastUsed: s.LastUsed(), load: s.InFlight() + s.QueueLen()}
	switch {
	case s.Loaded() == id && !s.gateClosed(p.opts.Now()):
		c.rank = rankReady
	case s.Loaded() == id || s.Target() == id || s.Queued(id):
		c.rank = rankLoading
	case s.Target() != "":
		c.rank = rankBusy // loading another profile
	case s.Loaded() == "" && s.QueueLen() == 0:
		c.rank = rankEmpty
	case s.InFlight() == 0 && s.QueueLen() == 0 && p.opts.Now().Sub(s.LastUsed()) >= s.Policy.IdleGrace:
		c.rank = rankIdle
	default:
		c.rank = rankBusy
	}
	return c
}

// Refuse makes every pool answer new and queued requests with ErrShutdown;
// leases already held run on. It is the first step of a graceful shutdown.
func (s *Set) Refuse() {
	for _, p := range s.pools {
		p.refuse()
	}
}
