package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// run is the pool's loop: it preloads the default, then acts on the scheduler's
// decisions until ctx ends, and then stops the engine.
func (p *Pool) run(ctx context.Context) {
	defer close(p.done)
	defer p.endActivity()
	p.mu.Lock()
	p.noteActivityLocked()
	if def := p.cfg.Lookup(p.spec.Default); def != nil && p.eng == nil && p.sched.QueueLen() == 0 { // an adopted engine serves already
		retired := p.beginLocked(def.ID)
		p.mu.Unlock()
		p.swap(ctx, def, retired)
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
		if p.failed != nil {
			p.mu.Unlock()
			p.stopFailed()
			continue
		}
		if p.selfSlept != 0 {
			p.mu.Unlock()
			p.adoptSelfSleeper()
			continue
		}
		if step := p.reloadStepLocked(); step != nil {
			p.mu.Unlock()
			if !step(ctx) {
				break
			}
			continue
		}
		p.answerLocked(p.sched.Stranded(), ErrNoSwap) // after a lost engine
		d := p.sched.Next(p.opts.Now())
		p.answerLocked(d.Admit, nil)
		var next *profile.Profile
		retired := false
		if d.Load != "" {
			next = p.cfg.Lookup(d.Load)
			if err := p.backoff.refusal(next, p.opts.Now()); err != nil {
				// Those who waited for it are told now, not at the backoff's end.
				p.answerLocked(p.sched.Drop(d.Load), err)
				next = nil
			} else {
				retired = p.beginLocked(d.Load)
			}
		} else if d.Unload || d.Release {
			retired = p.beginLocked("")
		} else if p.sched.Closing() && p.state == StateReady {
			p.setStateLocked(StateDraining)
		} else if !p.sched.Closing() && p.state == StateDraining && p.reload.step != reloadRetire {
			p.setStateLocked(StateReady) // the gate reopened: those waiting for others left
		}
		var exited <-chan struct{}
		if p.eng != nil {
			exited = p.eng.h.Exited()
		}
		p.mu.Unlock()
		if next != nil {
			p.swap(ctx, next, retired)
			continue
		}
		if d.Unload {
			p.unload()
			continue
		}
		if d.Release {
			p.release(ctx, retired)
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

// engineFailed records that engine e, serving, failed with err (Lease.Fail)
// and wakes the run loop to stop it.
func (p *Pool) engineFailed(e *engine, err error) {
	p.mu.Lock()
	if p.eng != e || p.failed != nil || p.sched.Loaded() != e.profile.ID {
		p.mu.Unlock()
		return // gone already, or already failing
	}
	p.failed = err
	// No new lease on it: requests for its profile queue for a fresh one.
	p.sched.Lost()
	p.setStateLocked(StateFailed)
	p.lastErr = err
	p.mu.Unlock()
	p.log.Error("engine failed while serving; stopping it", "profile", e.profile.ID, "pid", e.h.PID(), "err", err)
	p.wake()
}

// stopFailed stops the engine that failed while serving (engineFailed),
// leases still open or not: it serves them nothing any more.
func (p *Pool) stopFailed() {
	p.mu.Lock()
	e, err := p.eng, p.failed
	p.failed = nil
	if e == nil { // it exited meanwhile: engineExited dealt with it
		p.mu.Unlock()
		return
	}
	f := e.failedServing(err)
	wait := p.backoff.failed(e.profile, f, p.opts.Now())
	p.mu.Unlock()
	if _, stopErr := p.stopAndForget(e, e.profile.StopTimeout.Duration, f.exit); stopErr != nil {
		p.log.Error("stopping the failed engine", "profile", e.profile.ID, "err", stopErr)
	}
	p.log.Info("failed engine stopped", "profile", e.profile.ID, "exit", f.exit, "restart_backoff", wait)
}

// engineExited handles an engine that ended on its own while serving.
func (p *Pool) engineExited() {
	p.mu.Lock()
	e := p.eng
	p.eng = nil
	p.sched.Lost()
	p.setStateLocked(StateFailed)
	p.mu.Unlock()
	f := e.failedServing(e.failure()) // waits for its last lines: outside the lock
	p.mu.Lock()
	p.lastErr = f.err
	wait := p.backoff.failed(e.profile, f, p.opts.Now())
	p.mu.Unlock()
	p.log.Error("engine exited", "profile", e.profile.ID, "exit", f.exit, "err", f.err, "restart_backoff", wait)
	// Reap what is left of its group (grandchildren may survive their parent).
	if _, stopErr := p.stopAndForget(e, 0, f.exit); stopErr != nil {
		p.log.Error("cleaning up engine", "profile", e.profile.ID, "err", stopErr)
	}
}

// beginLocked records that a swap to id ("" for an unload) starts, and
// refuses the requests waiting for the profile swapped out that may not
// cause a swap back (Waiter.NoSwap). The engine swapped out goes now, so a
// reload's pending retire or preload step is taken here, under the same
// lock as the scheduler's Begin; retired reports whether a reload had
// retired that engine (it is stopped, never put to sleep). p.mu must be
// held.
func (p *Pool) beginLocked(id string) (retired bool) {
	p.sched.Begin(id)
	p.answerLocked(p.sched.Stranded(), ErrNoSwap)
	switch p.reload.step {
	case reloadRetire:
		retired = true
		p.reload = pendingReload{}
	case reloadPreload:
		p.reload = pendingReload{}
	}
	return retired
}

// swap replaces the pool's engine with one serving prof, under the swap
// contract. beginLocked has recorded the swap (retired is what it returned)
// and no lease is open.
func (p *Pool) swap(ctx context.Context, prof *profile.Profile, retired bool) {
	begin := p.opts.Now()
	phases := make(map[string]time.Duration, 4)
	p.mu.Lock()
	old := p.eng
	if !p.drainedAt.IsZero() {
		phases["drain"] = begin.Sub(p.drainedAt)
	}
	p.drainedAt = time.Time{}
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
			p.failSwap(ctx, prof, from, phases, nil, err)
			return
		}
		phases["stop"] = p.opts.Now().Sub(t) - release
		if release > 0 {
			phases["vram_release"] = release
		}
	}

	var own []int // a sleeper about to wake reclaims the memory it holds
	if sl != nil {
		own = sl.eng.h.Members()
	}
	p.makeGPURoom(prof, spec.GPUs, own)
	p.mu.Lock()
	p.setStateLocked(StateStarting)
	if sl != nil {
		p.eng = sl.eng
	}
	p.mu.Unlock()
	kind := KindCold
	if sl != nil && p.wakeSleeper(ctx, sl, from, phases) {
		kind = KindWake
	} else if ctx.Err() != nil {
		// No engine is started for a pool that stops.
		p.failSwap(ctx, prof, from, phases, nil, ctx.Err())
		return
	}
	// An engine that could not bind its port (taken between freePort and the
	// engine's bind), or that shares it with another process, is started
	// again on another, a bounded number of times; one that found too little
	// free GPU memory, once, after an eviction.
	var exposed error // listeners beyond loopback that did not fail the start
	memoryRetried := false
	for attempt := 1; kind == KindCold; attempt++ {
		t := p.opts.Now()
		p.log.Info("starting engine", "profile", prof.ID, "from", from, "attempt", attempt)
		e, err := startEngine(engineStart{
			Profile: prof, Spec: spec, Launch: p.opts.Launch, Supervisor: p.supervisor(),
			HTTP: p.http, Hurry: p.opts.hurry, Output: p.outputLog(),
		})
		if err != nil {
			p.failSwap(ctx, prof, from, phases, nil, fmt.Errorf("starting engine %q: %w", prof.ID, err))
			return
		}
		p.opts.Ledger.Add(e.record(p.name))
		p.mu.Lock()
		p.eng = e
		p.mu.Unlock()
		phases["start"] = p.opts.Now().Sub(t)

		t = p.opts.Now()
		err = e.waitReady(ctx, prof.StartupTimeout.Duration)
		if err != nil && !isClosed(e.h.Exited()) {
			// Alive but not ready (startupTimeout, or poold stopping): those
			// who wait are told now, not after the engine's stop grace.
			p.failSwap(ctx, prof, from, phases, e, err)
			p.stopUnready(e)
			return
		}
		if err == nil {
			exposed, err = p.checkSockets(e, spec.AllowNonLoopback)
		}
		if err == nil {
			phases["ready"] = p.opts.Now().Sub(t)
			e.served.Store(true)
			break
		}
		if _, stopErr := p.stopAndForget(e, prof.StopTimeout.Duration, statusapi.ExitLoadFailed); stopErr != nil {
			p.log.Error("stopping failed engine", "profile", prof.ID, "err", stopErr)
		}
		if errors.Is(err, proc.ErrPortShared) || e.portTaken() {
			if attempt < portAttempts {
				p.log.Warn("engine's port was taken; starting it on another", "profile", prof.ID, "port", e.port, "attempt", attempt, "err", err)
				continue
			}
			err = fmt.Errorf("engine %q found its port taken %d times in a row: %w", prof.ID, attempt, err)
		}
		if !memoryRetried && e.printed(noteMemoryShort) && p.evictOldest("vLLM found too little free GPU memory for "+prof.ID) {
			memoryRetried = true
			p.log.Warn("engine found too little free GPU memory; evicted a sleeper, starting it again", "profile", prof.ID, "attempt", attempt)
			continue
		}
		p.failSwap(ctx, prof, from, phases, e, err)
		return
	}
	now := p.opts.Now()

	p.mu.Lock()
	p.watchHealth(p.eng)
	p.lastErr = exposed
	p.readyAt = now
	p.backoff.ready(prof, now)
	p.lastSwap = now.Sub(begin)
	p.setStateLocked(StateReady)
	admitted := p.sched.Ready(prof.ID, now)
	p.noteActivityLocked() // the state went ready before the scheduler knew the profile
	markSwapCause(admitted)
	p.answerLocked(admitted, nil)
	p.mu.Unlock()
	p.log.Info("engine ready", "profile", prof.ID, "from", from, "kind", kind, "took", now.Sub(begin))
	p.observeSwap(from, prof.ID, kind, "ok", phases)
}

// unload stops the pool's engine for an explicit unload and leaves the pool
// empty. beginLocked has recorded the unload and no lease is open; a
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

// release puts the pool's idle engine to sleep, where its profile sleeps
// and there is room (sleepOut), or stops it, and leaves the pool empty:
// its idle timeout or a request's keep_alive ran out. beginLocked has
// recorded it (retired is what it returned) and no lease is open; a
// profile is loaded, so there is an engine. Requests that queued meanwhile
// load the profile again, a wake or a start, on the loop's next turn.
func (p *Pool) release(ctx context.Context, retired bool) {
	p.mu.Lock()
	e := p.eng
	p.drainedAt = time.Time{}
	p.setStateLocked(StateStopping)
	p.mu.Unlock()
	p.log.Info("releasing idle engine", "profile", e.profile.ID)
	action := statusapi.ReleaseSleep
	var err error
	if !p.sleepOut(ctx, e, retired) {
		action = statusapi.ReleaseStop
		_, err = p.stopEngine(e)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.log.Error("idle release failed", "profile", e.profile.ID, "err", err)
		p.lastErr = err
		p.setStateLocked(StateFailed)
		p.answerLocked(p.sched.Failed(""), err)
		return
	}
	p.log.Info("idle engine released", "profile", e.profile.ID, "action", action)
	p.lastErr = nil
	p.setStateLocked(StateEmpty)
	p.answerLocked(p.sched.Ready("", p.opts.Now()), nil)
	if p.opts.Observer != nil {
		p.opts.Observer.IdleRelease(p.name, e.profile.ID, action)
	}
}

// stopUnready stops an engine that did not become ready, once its waiters
// have been answered, and forgets it.
func (p *Pool) stopUnready(e *engine) {
	if _, err := p.stopAndForget(e, e.profile.StopTimeout.Duration, statusapi.ExitLoadFailed); err != nil {
		p.log.Error("stopping the engine that was not ready", "profile", e.profile.ID, "err", err)
	}
}

// failSwap records a failed swap and answers the profile's waiters at once.
// e is the engine that did not become ready, nil when none started.
func (p *Pool) failSwap(ctx context.Context, prof *profile.Profile, from string, phases map[string]time.Duration, e *engine, err error) {
	if ctx.Err() != nil {
		// Not a failure: poold is stopping, or the pool was removed.
		p.log.Info("swap abandoned: the pool is stopping", "profile", prof.ID, "from", from)
	} else {
		p.log.Error("swap failed", "profile", prof.ID, "from", from, "err", err)
	}
	p.mu.Lock()
	p.lastErr = err
	p.setStateLocked(StateFailed)
	f := failure{err: err, exit: statusapi.ExitLoadFailed}
	if e != nil {
		f.reason = e.said()
	}
	p.backoff.failed(prof, f, p.opts.Now())
	p.answerLocked(p.sched.Failed(prof.ID), &LoadError{Profile: prof.ID, Err: err})
	// Left empty by the failure, the pool goes back to its default once
	// nothing else is wanted, rather than sit empty.
	if def := p.cfg.Lookup(p.spec.Default); def != nil && def.ID != prof.ID && p.reload.step == reloadNone && ctx.Err() == nil {
		p.reload = pendingReload{step: reloadPreload, next: def.ID}
	}
	p.mu.Unlock()
	p.observeSwap(from, prof.ID, KindCold, "failed", phases)
}

// stopEngine stops e under the stop contract and forgets it. release is how
// long the VRAM check took, zero when it did not run or gave up.
func (p *Pool) stopEngine(e *engine) (release time.Duration, err error) {
	p.log.Info("stopping engine", "profile", e.profile.ID, "pid", e.h.PID())
	release, err = p.stopAndForget(e, e.profile.StopTimeout.Duration, exitStopped)
	if err != nil {
		return 0, fmt.Errorf("stopping engine %q: %w", e.profile.ID, err)
	}
	return release, nil
}

// exitStopped is the exit reason (Observer.EngineExit) of an engine that
// poold stopped.
const exitStopped = "stopped"

// stopAndForget is the one way the pool ends an engine: it stops all of e's
// processes (stopGroup, with grace: zero reaps what is left of one that
// exited), forgets e as the pool's engine, and reports its exit as reason.
// A stop that fails is returned, and an engine that was only to be stopped
// (reason exitStopped) is then not reported as stopped: its processes live
// on; one that failed or exited is reported all the same.
func (p *Pool) stopAndForget(e *engine, grace time.Duration, reason string) (release time.Duration, err error) {
	release, err = p.stopGroup(e, grace)
	p.mu.Lock()
	if p.eng == e {
		p.eng = nil
	}
	p.mu.Unlock()
	if err == nil || reason != exitStopped {
		p.observeExit(e.profile.ID, reason)
	}
	return release, err
}

// stopGroup stops all of e's processes (SIGTERM, grace, SIGKILL) and then,
// with a VRAM check configured, waits for the pool's GPUs to release its
// memory. A check that gives up is a warning, not a failed stop: the
// processes are gone.
// release is how long the check took, zero when it did not run or gave up.
func (p *Pool) stopGroup(e *engine, grace time.Duration) (release time.Duration, err error) {
	e.unwatchHealth()
	var released func() error
	if p.opts.VRAM != nil {
		released = p.opts.VRAM.Watch(e.gpus, e.h.Members())
	}
	if err := e.stop(grace, p.log); err != nil {
		return 0, err
	}
	rec := e.h.Record()
	p.opts.Ledger.Remove(rec.PID, rec.Shim)
	if released == nil {
		return 0, nil
	}
	t := p.opts.Now()
	if err := released(); err != nil {
		p.log.Warn("engine's GPU memory not released", "profile", e.profile.ID, "gpus", e.gpus, "err", err)
		if p.opts.Observer != nil {
			p.opts.Observer.VRAMNotReleased(p.name)
		}
		return 0, nil
	}
	// At least 1ns, so that a check that ran is told from one that did not.
	return max(p.opts.Now().Sub(t), time.Nanosecond), nil
}

// shutdown answers every waiter and stops the engine; it runs once the loop's
// context has ended. In-flight leases are the caller's to drain before that.
func (p *Pool) shutdown() {
	p.refuse(ErrShutdown)
	if p.opts.detach != nil && p.opts.detach.Load() {
		p.detachAll()
	}
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

// detachAll lets go of the pool's engines that run under shims, awake or
// asleep, for the next poold to adopt (Set.Detach); the ledger keeps them.
// Those without a shim are left to shutdown to stop.
func (p *Pool) detachAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.eng; e != nil && e.detach() {
		p.log.Info("engine left running for the next poold", "profile", e.profile.ID, "pid", e.h.PID())
		p.eng = nil
		p.sched.Lost()
		p.setStateLocked(StateEmpty)
	}
	for _, sl := range slices.Clone(p.sleepers) {
		if sl.eng.detach() {
			p.log.Info("sleeping engine left running for the next poold", "profile", sl.eng.profile.ID, "pid", sl.eng.h.PID())
			p.removeSleeperLocked(sl)
		}
	}
}
