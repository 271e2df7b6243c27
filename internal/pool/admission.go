package pool

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/poold/poold/internal/profile"
)

// Lease is one request's right to use a pool's ready engine. Release it exactly
// once when the request is over; further calls do nothing.
type Lease struct {
	Pool    string
	Profile *profile.Profile
	// Target is the engine's base URL (http://127.0.0.1:PORT), shared by every
	// lease on that engine: read it, never modify it.
	Target *url.URL
	// IdleTimeout is how long a connection to the engine may stay idle
	// between requests: below the engine's own keep-alive (idleTimeout).
	IdleTimeout time.Duration
	// Waited is how long the request queued before admission.
	Waited time.Duration
	// CausedSwap reports that the request was the oldest one waiting for the
	// swap that loaded its profile: the one that caused it.
	CausedSwap bool

	p    *Pool
	eng  *engine // the engine the lease is on
	once sync.Once
	keep KeepAlive // what the request asked of its engine's stay (Keep)
}

// Keep records the request's keep_alive, which applies to its engine from
// the lease's release: call it, if at all, before Release, from the
// request's goroutine. Unless set, the profile's idleTimeout holds.
func (l *Lease) Keep(d time.Duration) { l.keep = KeepAlive{Set: true, D: d} }

// Fail reports that the engine behind the lease failed while it served the
// request, though its process lives on (it stalled: it sent nothing for the
// stream idle timeout). The pool stops that engine at once, whatever else
// it serves, with err in its lastError, and the next request starts a fresh
// one. Calls after the first, or once the engine is gone, do nothing; the
// lease must still be released.
func (l *Lease) Fail(err error) { l.p.engineFailed(l.eng, err) }

// Succeeded reports that the engine behind the lease answered the request
// successfully: an engine that has is no longer on trial, and its death
// no death at its first request (statusapi.ExitFirstRequest), which the
// restart backoff counts however long the engine was ready before it.
// Call it, if at all, from the request's goroutine, before Release.
func (l *Lease) Succeeded() { l.eng.answered.Store(true) }

// Release returns the lease to its pool.
func (l *Lease) Release() {
	l.once.Do(func() {
		p := l.p
		p.mu.Lock()
		p.sched.Release(p.opts.Now(), l.keep)
		p.noteActivityLocked()
		kick := p.loopWaitsLocked()
		p.mu.Unlock()
		if kick {
			p.wake()
		}
	})
}

// loopWaitsLocked reports whether the run loop may act on a released lease:
// requests wait, the gate is closed for a drain, an idle release is due
// (its timer starts now), a reload step waits for the pool to empty, or a
// sleeper may need to go. In the steady state (an engine
// serving, nobody waiting) it does not, and a release wakes nothing: one
// goroutine hand-off fewer per request. p.mu must be held.
func (p *Pool) loopWaitsLocked() bool {
	s := &p.sched
	_, release := s.ReleaseAt()
	return s.QueueLen() > 0 || s.Closing() || s.Swapping() || s.Loaded() == "" || release ||
		p.reload.step != reloadNone || len(p.sleepers) > 0 || p.failed != nil
}

// grant is what a waiter receives: a lease or the reason it has none.
type grant struct {
	lease *Lease
	err   error
}

// QueueError is a refusal because the queue is full or the wait was too long;
// RetryAfter estimates when a retry could succeed.
type QueueError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *QueueError) Error() string { return e.Err.Error() }
func (e *QueueError) Unwrap() error { return e.Err }

// Acquire waits until prof is ready in this pool and the scheduler admits the
// request, then returns its lease. It returns early with ctx's error when the
// client goes away (leaving the queue at once), a *QueueError when the queue is
// full or the wait exceeds maxQueueWait (the profile's, else the pool's), or a
// *LoadError when the engine fails to load.
//
// c places the request in the fair share of prof's engine. hold, if not
// nil, is the Waiter's Hold: asked whether the request may queue when it
// cannot be admitted at once.
func (p *Pool) Acquire(ctx context.Context, prof *profile.Profile, c Caller, hold func() bool) (*Lease, error) {
	return p.enqueue(ctx, c.waiter(prof, hold), prof)
}

// Caller is whom a request is for: its tenant in the fair share of an
// engine with an admission ceiling (see Policy.MaxInFlight), and in the
// choice of the profile to load next, where a tenant of weight w counts
// ⌊log₁₀ w⌋ priority levels above its profile's priority (a tier of weight
// 10 one level) and a background tenant one level below; and what its
// pinned requests may swap. The zero value is the one tenant of a host
// without tenants, of weight 1, whose pinned requests may swap their pool.
type Caller struct {
	Tenant     string
	Weight     int
	Background bool
	// MaySwap, if not nil, says whether a request of the caller pinned to
	// a pool may swap that pool's model where placement would not put the
	// request (a tenant's pools); nil: it may, as the operator's requests
	// on a host without tenants.
	MaySwap func(pool string) bool
}

// waiter is the Waiter of c's request for prof.
func (c Caller) waiter(prof *profile.Profile, hold func() bool) *Waiter {
	bonus := 0
	for w := c.Weight; w >= 10; w /= 10 {
		bonus++
	}
	if c.Background {
		bonus = -1
	}
	return &Waiter{Profile: prof.ID, Priority: prof.Priority + bonus, Tenant: c.Tenant, Weight: c.Weight, Background: c.Background, Hold: hold}
}

// Load has prof loaded in this pool through the scheduler: the explicit load
// waits its turn and drains the pool like a request for prof, but holds no
// lease. It returns once prof is ready (at once if it already is and the gate
// is open), or with Acquire's errors; a client that goes away withdraws it.
func (p *Pool) Load(ctx context.Context, prof *profile.Profile) error {
	_, err := p.enqueue(ctx, &Waiter{Profile: prof.ID, Priority: prof.Priority, Intent: true}, prof)
	return err
}

// Unload has this pool's engine stopped through the scheduler: it waits its
// turn and drains the pool like a swap, and returns once the pool is empty
// (at once if it is), or with Acquire's errors; a stop that fails returns the
// stop's error.
func (p *Pool) Unload(ctx context.Context) error {
	_, err := p.enqueue(ctx, &Waiter{Intent: true}, nil)
	return err
}

// enqueue hands w to the scheduler and waits for its grant.
func (p *Pool) enqueue(ctx context.Context, w *Waiter, prof *profile.Profile) (*Lease, error) {
	a, err := p.arrive(w, prof)
	if err != nil {
		return nil, err
	}
	return p.await(ctx, a)
}

// arrival is a request (or intent) that reached a pool's scheduler: admitted
// at once, holding lease (nil for an intent), or queued as w.
type arrival struct {
	w        *Waiter
	admitted bool
	lease    *Lease
	maxWait  time.Duration // bounds the wait of a queued one; zero: none
}

// arrive hands w to the scheduler without waiting. prof is w's profile (nil
// for an unload).
func (p *Pool) arrive(w *Waiter, prof *profile.Profile) (arrival, error) {
	if err := p.preflight(prof); err != nil {
		return arrival{}, err
	}
	w.Arrived = p.opts.Now()
	w.done = make(chan grant, 1)
	p.mu.Lock()
	if p.refused != nil {
		p.mu.Unlock()
		return arrival{}, p.refused
	}
	if prof != nil && !p.servesLocked(prof.ID) {
		p.mu.Unlock()
		return arrival{}, ErrProfileRemoved // a reload took it away on the request's way here
	}
	if prof != nil && p.sched.Loaded() != prof.ID {
		if err := p.backoff.refusal(p.cfg.Lookup(prof.ID), w.Arrived); err != nil {
			p.mu.Unlock()
			return arrival{}, err
		}
	}
	if w.Hold != nil && !p.sched.Admits(w) && !w.Hold() {
		retry := p.retryAfterLocked()
		p.mu.Unlock()
		return arrival{}, &QueueError{Err: ErrQueueBudget, RetryAfter: retry}
	}
	admitted, err := p.sched.Arrive(w)
	a := arrival{w: w, admitted: admitted, maxWait: p.spec.MaxQueueWait.Duration}
	if admitted && !w.Intent {
		a.lease = p.leaseLocked(prof, 0)
	}
	if prof != nil {
		a.maxWait = prof.QueueWait(p.spec)
	}
	retry := p.retryAfterLocked()
	p.mu.Unlock()
	if errors.Is(err, ErrNoSwap) {
		return arrival{}, err
	}
	if err != nil {
		return arrival{}, &QueueError{Err: err, RetryAfter: retry}
	}
	if !admitted {
		p.wake()
	}
	return a, nil
}

// await waits for a queued arrival's grant, bounded by its maxWait and ctx.
func (p *Pool) await(ctx context.Context, a arrival) (*Lease, error) {
	if a.admitted {
		return a.lease, nil
	}
	var timeout <-chan time.Time
	if a.maxWait > 0 {
		t := time.NewTimer(a.maxWait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case g := <-a.w.done:
		return g.lease, g.err
	case <-ctx.Done():
		return nil, p.leave(a.w, ctx.Err())
	case <-timeout:
		p.mu.Lock()
		retry := p.retryAfterLocked()
		p.mu.Unlock()
		return nil, p.leave(a.w, &QueueError{Err: ErrQueueTimeout, RetryAfter: retry})
	}
}

// leave takes w out of the queue and returns err; if w was granted a lease in
// the meantime, the lease is released.
func (p *Pool) leave(w *Waiter, err error) error {
	p.mu.Lock()
	removed := p.sched.Cancel(w)
	p.mu.Unlock()
	if removed {
		p.wake()
		return err
	}
	if g := <-w.done; g.lease != nil {
		g.lease.Release()
	}
	return err
}

// leaseLocked makes a lease on the current engine; p.mu must be held and the
// scheduler must have counted it in flight.
func (p *Pool) leaseLocked(prof *profile.Profile, waited time.Duration) *Lease {
	p.noteActivityLocked()
	p.eng.leased.Store(true)
	return &Lease{Pool: p.name, Profile: prof, Target: p.eng.target, IdleTimeout: p.eng.idle, Waited: waited, p: p, eng: p.eng}
}

// retryAfterLocked estimates how long until a queued request could be served:
// one swap per distinct profile waiting, plus the residency. p.mu must be held.
func (p *Pool) retryAfterLocked() time.Duration {
	swap := p.lastSwap
	if swap == 0 {
		swap = 10 * time.Second
	}
	waiting, _ := p.sched.Waiting()
	return p.sched.Policy.residency(p.sched.Loaded()) + time.Duration(len(waiting)+1)*swap
}

func (p *Pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// answer hands each waiter its grant: a lease on the current engine, or err.
// p.mu must be held.
func (p *Pool) answerLocked(ws []*Waiter, err error) {
	now := p.opts.Now()
	for _, w := range ws {
		switch {
		case err != nil:
			w.done <- grant{err: err}
		case w.Intent:
			w.done <- grant{} // done; an intent holds no lease
		default:
			l := p.leaseLocked(p.cfg.Lookup(w.Profile), now.Sub(w.Arrived))
			l.CausedSwap = w.causedSwap
			w.done <- grant{lease: l}
		}
	}
}

// refuse stops admissions: queued and new requests get err (or the error of
// an earlier refusal).
func (p *Pool) refuse(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuseLocked(err)
}

func (p *Pool) refuseLocked(err error) {
	if p.refused == nil {
		p.refused = err
	}
	p.answerLocked(p.sched.Drop(""), p.refused)
}

// PreflightError is why a profile's engine would not start on this host,
// found before the pool drained anything for it.
type PreflightError struct{ Problems []error }

func (e *PreflightError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, err := range e.Problems {
		msgs[i] = err.Error()
	}
	return "the engine would not start on this host: " + strings.Join(msgs, "; ")
}

// preflight checks, against Options.Host, that prof's engine could start,
// when serving prof would take a cold start here (it is not loaded, loading,
// queued for or asleep in the pool). It returns a *LoadError wrapping a
// *PreflightError when it could not. The check runs outside the pool's
// mutex: it looks at the file system.
func (p *Pool) preflight(prof *profile.Profile) error {
	if prof == nil || p.opts.Host.LookPath == nil && p.opts.Host.Stat == nil {
		return nil
	}
	p.mu.Lock()
	s := &p.sched
	cold := s.Loaded() != prof.ID && s.Target() != prof.ID && !s.Queued(prof.ID) && !p.hasSleeperLocked(prof.ID)
	p.mu.Unlock()
	if !cold {
		return nil
	}
	if problems := prof.Preflight(p.opts.Host, p.opts.Launch); len(problems) > 0 {
		return &LoadError{Profile: prof.ID, Err: &PreflightError{Problems: problems}}
	}
	return nil
}
