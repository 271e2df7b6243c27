package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/placement"
	"github.com/poold/poold/internal/profile"
)

// ErrNoPool is returned when a profile may not run on the pool asked for.
var ErrNoPool = errors.New("no such pool for this model")

// Set is every pool of a host. Apply replaces its pool list; requests read
// the list without locking.
type Set struct {
	opts Options
	list atomic.Pointer[poolList] // the pools in service, replaced whole by Apply

	// placeMu maps a profile id to the *sync.Mutex that makes placement and
	// arrival atomic for it (see Acquire); entries live as long as the Set.
	placeMu sync.Map
	// placed, when set (tests only), is called between the placement of a
	// request for profile and its arrival at p.
	placed func(profile string, p *Pool)

	hurryOnce sync.Once // closes opts.hurry

	mu  sync.Mutex      // guards ctx; serialises Run and Apply
	ctx context.Context // the pools' parent context, set by Run; nil before
	wg  sync.WaitGroup  // counts running pool loops, removed pools' included
}

// poolList is one immutable generation of a Set's pools.
type poolList struct {
	all []*Pool // in file order
	by  map[string]*Pool
}

// NewSet builds one Pool per pool of cfg. Call Run to start them.
func NewSet(cfg *profile.Config, opts Options) *Set {
	opts.host = new(hostSleep)
	opts.spawn = proc.ProcessSpawner()
	opts.hurry = make(chan struct{})
	opts.detach = new(atomic.Bool)
	hc := proc.NewClients(opts.ProbeClient, opts.ControlClient) // shared by every pool of the set
	opts.ProbeClient, opts.ControlClient = hc.Probe, hc.Control
	s := &Set{opts: opts}
	s.list.Store(&poolList{})
	s.Apply(cfg)
	return s
}

// Run starts every pool's loop (each preloads its default) and returns at once;
// pools added later by Apply start at once. When ctx ends, the pools stop their
// engines; Wait blocks until they have.
func (s *Set) Run(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctx = ctx
	for _, p := range s.list.Load().all {
		s.start(p)
	}
}

// start runs p's loop under its own context, so that a removed pool can be
// stopped alone. s.mu must be held.
func (s *Set) start(p *Pool) {
	ctx, cancel := context.WithCancel(s.ctx)
	p.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		p.run(ctx)
	}()
}

// Wait blocks until every pool loop, including those of removed pools, has
// stopped its engine and ended.
func (s *Set) Wait() { s.wg.Wait() }

// Pool returns the named pool, or nil.
func (s *Set) Pool(name string) *Pool { return s.list.Load().by[name] }

// Pools returns the pools in file order. The caller must not modify the slice.
func (s *Set) Pools() []*Pool { return s.list.Load().all }

// Acquire places a request for prof on a pool and waits for its lease. A
// non-empty pin names the only pool allowed; c and hold are as in
// Pool.Acquire. A pinned request whose caller may not swap that pool
// (Caller.MaySwap) may cause a swap there only where placement would put
// it unpinned (the pinned pool ranks with the best); elsewhere it is served
// only by its profile loaded or loading there (Waiter.NoSwap), and refused
// with ErrNoSwap otherwise.
//
// Placement and arrival are atomic for a profile: two first requests for it
// arriving together join one pool, instead of each finding the pools as they
// were before the other arrived and starting the model twice.
func (s *Set) Acquire(ctx context.Context, prof *profile.Profile, pin string, c Caller, hold func() bool) (*Lease, error) {
	var pinned *Pool
	if pin != "" {
		pinned = s.Pool(pin)
		if pinned == nil || !prof.EligibleOn(pin) {
			return nil, ErrNoPool
		}
		if c.MaySwap == nil || c.MaySwap(pin) {
			return pinned.Acquire(ctx, prof, c, hold)
		}
	}
	mu := s.placing(prof.ID)
	mu.Lock()
	p, best := s.place(prof)
	if p == nil {
		mu.Unlock()
		return nil, ErrProfileRemoved // every pool it ran on was removed by a reload
	}
	w := c.waiter(prof, hold)
	if pinned != nil {
		w.NoSwap = p != pinned && placement.Compare(pinned.candidate(prof.ID), best) > 0
		p = pinned
	}
	if s.placed != nil {
		s.placed(prof.ID, p)
	}
	a, err := p.arrive(w, prof)
	mu.Unlock()
	if err != nil {
		return nil, err
	}
	return p.await(ctx, a)
}

// placing returns the mutex that makes placement and arrival atomic for
// profile id.
func (s *Set) placing(id string) *sync.Mutex {
	if mu, ok := s.placeMu.Load(id); ok {
		return mu.(*sync.Mutex)
	}
	mu, _ := s.placeMu.LoadOrStore(id, new(sync.Mutex))
	return mu.(*sync.Mutex)
}

// place chooses the pool for prof among those it is eligible on, by the
// shared placement order (package placement): ready with it, then loading it,
// then where it sleeps, then empty, then the one whose profile is idle
// longest, then the shortest queue. It never starts a second copy while one
// exists or loads. It returns the pool's candidate too; nil when prof is
// eligible on no pool.
func (s *Set) place(prof *profile.Profile) (*Pool, placement.Candidate) {
	var best *Pool
	var bestC placement.Candidate
	for _, p := range s.Pools() {
		if !prof.EligibleOn(p.name) {
			continue
		}
		c := p.candidate(prof.ID)
		if best == nil || placement.Compare(c, bestC) < 0 {
			best, bestC = p, c
		}
	}
	return best, bestC
}

// candidate ranks the pool for profile id.
func (p *Pool) candidate(id string) placement.Candidate {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.sched
	now := p.opts.Now()
	return placement.Of(placement.Pool{
		Loaded:     s.Loaded(),
		Target:     s.Target(),
		Swapping:   s.Swapping(),
		GateClosed: s.gateClosed(now),
		Queued:     s.Queued(id),
		Asleep:     p.hasSleeperLocked(id),
		InFlight:   s.InFlight(),
		Waiting:    s.QueueLen(),
		LastUsed:   s.LastUsed(),
	}, id, now, s.IdleGrace())
}

// Hurry cuts short the SIGTERM grace of every engine stop from now on,
// under way or to come: the stops SIGKILL at once (a second signal at
// shutdown). It may be called more than once.
func (s *Set) Hurry() {
	s.hurryOnce.Do(func() { close(s.opts.hurry) })
}

// Detach makes the pools, when their context ends, let go of their engines
// that run under shims instead of stopping them, for the next poold to
// adopt (Adopt). Call it before ending the context of Run.
func (s *Set) Detach() { s.opts.detach.Store(true) }

// Refuse makes every pool answer new and queued requests with ErrShutdown;
// leases already held run on. It is the first step of a graceful shutdown.
func (s *Set) Refuse() {
	for _, p := range s.Pools() {
		p.refuse(ErrShutdown)
	}
}
