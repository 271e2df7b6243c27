// Package pool runs one engine per GPU pool: admission of requests, the swap
// scheduler's decisions, the engine's process lifecycle under the swap contract
// (drain, bounded stop, readiness gate), and placement across the pools of a host.
package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// State is a pool's externally visible state, as /status shows it.
type State = statusapi.PoolState

// The pool states.
const (
	StateEmpty    = statusapi.StateEmpty
	StateStarting = statusapi.StateStarting
	StateReady    = statusapi.StateReady
	StateDraining = statusapi.StateDraining
	StateStopping = statusapi.StateStopping
	StateSleeping = statusapi.StateSleeping
	StateFailed   = statusapi.StateFailed
)

// ErrShutdown answers requests still waiting when poold shuts down.
var ErrShutdown = errors.New("poold is shutting down")

// LoadError is a failed engine start or load, handed to every request that
// waited for it.
type LoadError struct {
	Profile string
	Err     error
}

func (e *LoadError) Error() string { return fmt.Sprintf("loading %q: %v", e.Profile, e.Err) }
func (e *LoadError) Unwrap() error { return e.Err }

// Observer receives a pool's lifecycle events, for metrics. Its methods must not
// block. A nil Observer in Options means none.
type Observer interface {
	// Swap reports one finished swap attempt: from ("" when the pool was empty),
	// to, kind (KindCold: an engine was started; KindWake: a sleeping one was
	// woken), result ("ok", "failed", or "wake_failed" for a wake that failed,
	// after which a cold start follows and is reported too) and the duration
	// of each phase (drain, stop or sleep, vram_release, start, ready, wake).
	Swap(pool, from, to, kind, result string, phases map[string]time.Duration)
	// EngineExit reports an engine process that ended, and why: "stopped",
	// "crashed" or "load_failed".
	EngineExit(pool, profile, reason string)
	// VRAMNotReleased reports a stopped engine whose GPU memory was still held
	// when the VRAM check gave up.
	VRAMNotReleased(pool string)
	// SleepVRAMNotReleased reports an engine put to sleep whose GPU memory did
	// not drop; the pool stopped it instead of keeping it asleep.
	SleepVRAMNotReleased(pool string)
}

// VRAM reads the pool's GPU memory (through NVML in poold).
//
// Watch is the stop contract's last step: checking that a stopped engine's GPU
// memory was released. It is called just before the stop, with the pool's
// GPUs and the live pids of the engine's process group; the function it
// returns is called once the group is gone and blocks, for at most the
// implementation's own bound, until the memory is released, or returns an
// error naming the processes still holding it.
//
// WatchSleep is the same check for an engine put to sleep, whose processes
// live on: called just before POST /sleep, its function is called once the
// engine confirms it sleeps and blocks, for at most the same bound, until each
// GPU's used memory fell by at least half of what those pids held, or returns
// an error (also when the GPUs cannot be read).
//
// Free reads the free and total memory of the given GPUs, summed.
type VRAM interface {
	Watch(gpus []int, pids []int) (released func() error)
	WatchSleep(gpus []int, pids []int) (released func() error)
	Free(gpus []int) (free, total uint64, err error)
}

// Options configures a Pool. Self is poold's executable (for {poold} in engine
// commands); Now defaults to time.Now; a nil VRAM skips the VRAM checks, of
// stops and of sleeps, and the eviction of sleepers for GPU memory (no NVML).
type Options struct {
	Self     string
	Logger   *slog.Logger
	Observer Observer
	VRAM     VRAM
	// Ledger records the engines started, for crash clean-up; nil records none.
	Ledger *Ledger
	Now    func() time.Time
	// host counts the host RAM held by the sleepers of all pools of a Set;
	// set by NewSet (nil, outside a Set, is a fresh count per pool).
	host *hostSleep
	// spawn starts the engines of all pools of a Set from one long-lived
	// thread (see spawner); set by NewSet (nil, outside a Set, starts directly).
	spawn spawner
	// RestartBackoff is the wait before the second start in a row of a profile
	// whose engine failed twice in a row, doubling with each further failure up
	// to MaxRestartBackoff (restartBackoff in backoff.go). Zero values mean
	// DefaultRestartBackoff and DefaultMaxRestartBackoff.
	RestartBackoff, MaxRestartBackoff time.Duration
}

// Pool owns one GPU set and at most one engine on it.
//
// Its run loop is the only goroutine that starts or stops engines. Acquire and
// Lease.Release run on request goroutines and talk to the loop through the
// scheduler (under mu) and the kick channel.
type Pool struct {
	name string
	opts Options
	log  *slog.Logger
	kick chan struct{} // buffered(1): wakes the run loop
	done chan struct{} // closed when the run loop has ended
	// cancel ends the run loop's context; set by the Set before the loop starts.
	cancel context.CancelFunc

	mu        sync.Mutex // guards every field below
	spec      *profile.PoolSpec
	cfg       *profile.Config
	sched     Scheduler
	state     State
	eng       *engine    // the engine starting or serving; nil when none
	sleepers  []*sleeper // engines asleep (sleep.go), least recently used first
	since     time.Time
	lastErr   error
	lastSwap  time.Duration // duration of the last successful swap, for Retry-After
	readyAt   time.Time
	refused   error // non-nil once the pool admits no more requests: what they get
	drainedAt time.Time
	backoff   restartBackoff // spaces out the restarts of a failing profile
	// Reloads (reload.go): retiring marks an engine a reload removed or
	// changed, which takes no new leases and is stopped once its last lease
	// ends; want is a profile to load once the pool is otherwise idle (the
	// changed profile, or a new default), "" for none; dirty asks the loop to
	// check the engine against the profiles once the swap under way is over;
	// removing marks a pool a reload removed.
	retiring, dirty, removing bool
	want                      string
}

func newPool(spec *profile.PoolSpec, cfg *profile.Config, opts Options) *Pool {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.host == nil {
		opts.host = new(hostSleep)
	}
	p := &Pool{
		name:  spec.Name,
		opts:  opts,
		log:   opts.Logger.With("component", "pool", "pool", spec.Name),
		kick:  make(chan struct{}, 1),
		done:  make(chan struct{}),
		spec:  spec,
		cfg:   cfg,
		state: StateEmpty,
		since: opts.Now(),
	}
	p.backoff.base, p.backoff.max = cmp.Or(opts.RestartBackoff, DefaultRestartBackoff), cmp.Or(opts.MaxRestartBackoff, DefaultMaxRestartBackoff)
	p.sched.Policy = policyFor(spec, cfg)
	return p
}

// policyFor is the scheduling policy of the pool spec under cfg: the pool's
// settings, with the residency of each eligible profile that sets its own.
func policyFor(spec *profile.PoolSpec, cfg *profile.Config) Policy {
	pol := Policy{
		MinResidency: spec.MinResidency.Duration,
		IdleGrace:    DefaultIdleGrace,
		PriorityAge:  DefaultPriorityAge,
		MaxQueue:     spec.MaxQueue,
	}
	for _, prof := range cfg.Profiles {
		if d, own := prof.Residency(spec); own && prof.EligibleOn(spec.Name) {
			if pol.Residency == nil {
				pol.Residency = make(map[string]time.Duration)
			}
			pol.Residency[prof.ID] = d
		}
	}
	return pol
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.name }

// Lease is one request's right to use a pool's ready engine. Release it exactly
// once when the request is over; further calls do nothing.
type Lease struct {
	Pool    string
	Profile *profile.Profile
	// Target is the engine's base URL (http://127.0.0.1:PORT), shared by every
	// lease on that engine: read it, never modify it.
	Target *url.URL
	// Waited is how long the request queued before admission.
	Waited time.Duration

	p    *Pool
	once sync.Once
}

// Release returns the lease to its pool.
func (l *Lease) Release() {
	l.once.Do(func() {
		p := l.p
		p.mu.Lock()
		p.sched.Release(p.opts.Now())
		kick := p.loopWaitsLocked()
		p.mu.Unlock()
		if kick {
			p.wake()
		}
	})
}

// loopWaitsLocked reports whether the run loop may act on a released lease:
// requests wait, the gate is closed for a drain, a reload step waits for the
// pool to empty, or a sleeper may need to go. In the steady state (an engine
// serving, nobody waiting) it does not, and a release wakes nothing: one
// goroutine hand-off fewer per request. p.mu must be held.
func (p *Pool) loopWaitsLocked() bool {
	s := &p.sched
	return s.QueueLen() > 0 || s.Closing() || s.Swapping() || s.Loaded() == "" ||
		p.dirty || p.retiring || p.removing || p.want != "" || len(p.sleepers) > 0
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
func (p *Pool) Acquire(ctx context.Context, prof *profile.Profile) (*Lease, error) {
	return p.enqueue(ctx, &Waiter{Profile: prof.ID, Priority: prof.Priority}, prof)
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

// enqueue hands w to the scheduler and waits for its grant. prof is w's
// profile (nil for an unload); the wait is bounded by its maxQueueWait.
func (p *Pool) enqueue(ctx context.Context, w *Waiter, prof *profile.Profile) (*Lease, error) {
	w.Arrived = p.opts.Now()
	w.done = make(chan grant, 1)
	p.mu.Lock()
	if p.refused != nil {
		p.mu.Unlock()
		return nil, p.refused
	}
	if prof != nil && !p.servesLocked(prof.ID) {
		p.mu.Unlock()
		return nil, ErrProfileRemoved // a reload took it away on the request's way here
	}
	if prof != nil && p.sched.Loaded() != prof.ID {
		if err := p.backoff.refusal(p.cfg.Lookup(prof.ID), w.Arrived); err != nil {
			p.mu.Unlock()
			return nil, err
		}
	}
	admitted, err := p.sched.Arrive(w)
	var lease *Lease
	if admitted && !w.Intent {
		lease = p.leaseLocked(prof, 0)
	}
	maxWait := p.spec.MaxQueueWait.Duration
	if prof != nil {
		maxWait = prof.QueueWait(p.spec)
	}
	retry := p.retryAfterLocked()
	p.mu.Unlock()
	if err != nil {
		return nil, &QueueError{Err: err, RetryAfter: retry}
	}
	if admitted {
		return lease, nil
	}
	p.wake()

	var timeout <-chan time.Time
	if maxWait > 0 {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case g := <-w.done:
		return g.lease, g.err
	case <-ctx.Done():
		return nil, p.leave(w, ctx.Err())
	case <-timeout:
		p.mu.Lock()
		retry := p.retryAfterLocked()
		p.mu.Unlock()
		return nil, p.leave(w, &QueueError{Err: ErrQueueTimeout, RetryAfter: retry})
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
	return &Lease{Pool: p.name, Profile: prof, Target: p.eng.target, Waited: waited, p: p}
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
			w.done <- grant{lease: p.leaseLocked(p.cfg.Lookup(w.Profile), now.Sub(w.Arrived))}
		}
	}
}

// run is the pool's loop: it preloads the default, then acts on the scheduler's
// decisions until ctx ends, and then stops the engine.
func (p *Pool) run(ctx context.Context) {
	defer close(p.done)
	p.mu.Lock()
	if def := p.cfg.Lookup(p.spec.Default); def != nil && p.sched.QueueLen() == 0 {
		p.sched.Begin(def.ID)
		p.mu.Unlock()
		p.swap(ctx, def)
	} else {
		p.mu.Unlock()
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		p.mu.Lock()
		if sl, why := p.staleSleeperLocked(); sl != nil {
			p.mu.Unlock()
			p.stopSleeper(sl, why)
			continue
		}
		if step := p.reloadStepLocked(); step != nil {
			p.mu.Unlock()
			if !step(ctx) {
				break
			}
			continue
		}
		d := p.sched.Next(p.opts.Now())
		p.answerLocked(d.Admit, nil)
		var next *profile.Profile
		if d.Load != "" {
			next = p.cfg.Lookup(d.Load)
			if err := p.backoff.refusal(next, p.opts.Now()); err != nil {
				// Those who waited for it are told now, not at the backoff's end.
				p.answerLocked(p.sched.Drop(d.Load), err)
				next = nil
			} else {
				p.sched.Begin(d.Load)
			}
		} else if d.Unload {
			p.sched.Begin("")
		} else if p.sched.Closing() && p.state == StateReady {
			p.setStateLocked(StateDraining)
		} else if !p.sched.Closing() && p.state == StateDraining && !p.retiring {
			p.setStateLocked(StateReady) // the gate reopened: those waiting for others left
		}
		var exited <-chan struct{}
		if p.eng != nil {
			exited = p.eng.exited
		}
		p.mu.Unlock()
		if next != nil {
			p.swap(ctx, next)
			continue
		}
		if d.Unload {
			p.unload()
			continue
		}
		var recheck <-chan time.Time
		if !d.Recheck.IsZero() {
			timer.Reset(max(d.Recheck.Sub(p.opts.Now()), time.Millisecond))
			recheck = timer.C
		}
		select {
		case <-ctx.Done():
		case <-p.kick:
		case <-recheck:
		case <-exited:
			p.engineExited()
		}
	}
	p.shutdown()
}

// engineExited handles an engine that ended on its own while serving.
func (p *Pool) engineExited() {
	p.mu.Lock()
	e := p.eng
	p.eng = nil
	p.sched.Lost()
	err := e.failure()
	p.lastErr = err
	p.setStateLocked(StateFailed)
	wait := p.backoff.failed(e.profile, err, p.opts.Now())
	p.mu.Unlock()
	p.log.Error("engine exited", "profile", e.profile.ID, "err", err, "restart_backoff", wait)
	// Reap what is left of its group (grandchildren may survive their parent).
	if _, stopErr := p.stopGroup(e, 0); stopErr != nil {
		p.log.Error("cleaning up engine", "profile", e.profile.ID, "err", stopErr)
	}
	p.observeExit(e.profile.ID, "crashed")
}

// swap replaces the pool's engine with one serving prof, under the swap
// contract. The scheduler has already recorded Begin(prof.ID) and no lease is open.
func (p *Pool) swap(ctx context.Context, prof *profile.Profile) {
	begin := p.opts.Now()
	phases := make(map[string]time.Duration, 4)
	p.mu.Lock()
	old := p.eng
	if !p.drainedAt.IsZero() {
		phases["drain"] = begin.Sub(p.drainedAt)
	}
	p.drainedAt = time.Time{}
	retired := p.retiring
	p.retiring, p.want = false, "" // the old engine goes now, whatever replaces it
	// Taken out first, so that making room for old's sleep cannot evict it.
	sl := p.takeSleeperLocked(prof.ID)
	from := ""
	if old != nil {
		from = old.profile.ID
		p.setStateLocked(StateStopping)
	}
	spec := p.spec
	p.mu.Unlock()

	if old != nil && p.sleepOut(ctx, old, retired) {
		phases["sleep"] = p.opts.Now().Sub(begin)
	} else if old != nil {
		t := p.opts.Now()
		release, err := p.stopEngine(old)
		if err != nil {
			if sl != nil {
				p.stopSleeper(sl, "swap failed")
			}
			p.failSwap(prof, from, phases, err)
			return
		}
		phases["stop"] = p.opts.Now().Sub(t) - release
		if release > 0 {
			phases["vram_release"] = release
		}
	}

	p.makeGPURoom(prof, spec.GPUs)
	p.mu.Lock()
	p.setStateLocked(StateStarting)
	if sl != nil {
		p.eng = sl.eng
	}
	p.mu.Unlock()
	kind := KindCold
	if sl != nil && p.wakeSleeper(ctx, sl, from, phases) {
		kind = KindWake
	}
	// An engine that could not bind its port (taken between freePort and the
	// engine's bind) is started again on another, a bounded number of times.
	for attempt := 1; kind == KindCold; attempt++ {
		t := p.opts.Now()
		p.log.Info("starting engine", "profile", prof.ID, "from", from, "attempt", attempt)
		e, err := startEngine(prof, spec, p.opts.Self, p.opts.spawn, p.log)
		if err != nil {
			p.failSwap(prof, from, phases, fmt.Errorf("starting engine %q: %w", prof.ID, err))
			return
		}
		p.opts.Ledger.add(p.name, e)
		p.mu.Lock()
		p.eng = e
		p.mu.Unlock()
		phases["start"] = p.opts.Now().Sub(t)

		t = p.opts.Now()
		err = e.waitReady(ctx, prof.StartupTimeout.Duration)
		if err == nil {
			phases["ready"] = p.opts.Now().Sub(t)
			break
		}
		if _, stopErr := p.stopGroup(e, prof.StopTimeout.Duration); stopErr != nil {
			p.log.Error("stopping failed engine", "profile", prof.ID, "err", stopErr)
		}
		p.mu.Lock()
		p.eng = nil
		p.mu.Unlock()
		p.observeExit(prof.ID, "load_failed")
		if e.portTaken() {
			if attempt < portAttempts {
				p.log.Warn("engine's port was taken; starting it on another", "profile", prof.ID, "port", e.port, "attempt", attempt)
				continue
			}
			err = fmt.Errorf("engine %q found its port taken %d times in a row: %w", prof.ID, attempt, err)
		}
		p.failSwap(prof, from, phases, err)
		return
	}
	now := p.opts.Now()

	p.mu.Lock()
	p.lastErr = nil
	p.readyAt = now
	p.backoff.ready(now)
	p.lastSwap = now.Sub(begin)
	p.setStateLocked(StateReady)
	p.answerLocked(p.sched.Ready(prof.ID, now), nil)
	p.mu.Unlock()
	p.log.Info("engine ready", "profile", prof.ID, "from", from, "kind", kind, "took", now.Sub(begin))
	p.observeSwap(from, prof.ID, kind, "ok", phases)
}

// unload stops the pool's engine for an explicit unload and leaves the pool
// empty. The scheduler has already recorded Begin("") and no lease is open; a
// profile is loaded, so there is an engine.
func (p *Pool) unload() {
	p.mu.Lock()
	e := p.eng
	p.drainedAt = time.Time{} // an unload is not a swap: no drain phase to report
	p.setStateLocked(StateStopping)
	p.mu.Unlock()
	_, err := p.stopEngine(e)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.log.Error("unload failed", "profile", e.profile.ID, "err", err)
		p.lastErr = err
		p.setStateLocked(StateFailed)
		p.answerLocked(p.sched.Failed(""), err)
		return
	}
	p.log.Info("engine unloaded", "profile", e.profile.ID)
	p.lastErr = nil
	p.setStateLocked(StateEmpty)
	p.answerLocked(p.sched.Ready("", p.opts.Now()), nil)
}

// failSwap records a failed swap and answers the profile's waiters at once.
func (p *Pool) failSwap(prof *profile.Profile, from string, phases map[string]time.Duration, err error) {
	p.log.Error("swap failed", "profile", prof.ID, "from", from, "err", err)
	p.mu.Lock()
	p.lastErr = err
	p.setStateLocked(StateFailed)
	p.backoff.failed(prof, err, p.opts.Now())
	p.answerLocked(p.sched.Failed(prof.ID), &LoadError{Profile: prof.ID, Err: err})
	p.mu.Unlock()
	p.observeSwap(from, prof.ID, KindCold, "failed", phases)
}

// stopEngine stops e under the stop contract and forgets it. release is how
// long the VRAM check took, zero when it did not run or gave up.
func (p *Pool) stopEngine(e *engine) (release time.Duration, err error) {
	p.log.Info("stopping engine", "profile", e.profile.ID, "pid", e.pid)
	release, err = p.stopGroup(e, e.profile.StopTimeout.Duration)
	p.mu.Lock()
	if p.eng == e {
		p.eng = nil
	}
	p.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("stopping engine %q: %w", e.profile.ID, err)
	}
	p.observeExit(e.profile.ID, "stopped")
	return release, nil
}

// stopGroup stops e's process group (SIGTERM, grace, SIGKILL) and then, with a
// VRAM check configured, waits for the pool's GPUs to release its memory. A
// check that gives up is a warning, not a failed stop: the group is gone.
// release is how long the check took, zero when it did not run or gave up.
func (p *Pool) stopGroup(e *engine, grace time.Duration) (release time.Duration, err error) {
	var released func() error
	if p.opts.VRAM != nil {
		released = p.opts.VRAM.Watch(p.spec.GPUs, groupMembers(e.pid))
	}
	if err := e.stop(grace, p.log); err != nil {
		return 0, err
	}
	p.opts.Ledger.remove(e)
	if released == nil {
		return 0, nil
	}
	t := p.opts.Now()
	if err := released(); err != nil {
		p.log.Warn("engine's GPU memory not released", "profile", e.profile.ID, "gpus", p.spec.GPUs, "err", err)
		if p.opts.Observer != nil {
			p.opts.Observer.VRAMNotReleased(p.name)
		}
		return 0, nil
	}
	// At least 1ns, so that a check that ran is told from one that did not.
	return max(p.opts.Now().Sub(t), time.Nanosecond), nil
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

// shutdown answers every waiter and stops the engine; it runs once the loop's
// context has ended. In-flight leases are the caller's to drain before that.
func (p *Pool) shutdown() {
	p.refuse(ErrShutdown)
	defer p.stopSleepers()
	p.mu.Lock()
	e := p.eng
	if e != nil {
		p.setStateLocked(StateStopping)
	}
	p.mu.Unlock()
	if e == nil {
		return
	}
	if _, err := p.stopEngine(e); err != nil {
		p.log.Error("shutdown", "err", err)
	}
	p.mu.Lock()
	p.sched.Lost()
	p.setStateLocked(StateEmpty)
	p.mu.Unlock()
}

// setStateLocked moves the pool to s; p.mu must be held.
func (p *Pool) setStateLocked(s State) {
	if p.state == s {
		return
	}
	if s == StateDraining {
		p.drainedAt = p.opts.Now()
	}
	p.state = s
	p.since = p.opts.Now()
}

func (p *Pool) observeSwap(from, to, kind, result string, phases map[string]time.Duration) {
	if p.opts.Observer != nil {
		p.opts.Observer.Swap(p.name, from, to, kind, result, phases)
	}
}

func (p *Pool) observeExit(profile, reason string) {
	if p.opts.Observer != nil {
		p.opts.Observer.EngineExit(p.name, profile, reason)
	}
}
