package pool

import (
	"context"
	"slices"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// Swap kinds (Observer.Swap).
const (
	KindCold = "cold" // a new engine process was started
	KindWake = "wake" // a sleeping engine was woken
)

// sleepOut tries to put old, the engine the pool swaps out, to sleep instead
// of stopping it, and reports whether it did. It does when its profile (as
// the pool serves it now, unchanged) enables sleep, room is made among the
// pool's sleepers (maxSleeping, and the host's sleepMemoryBudget, evicting
// the least recently used with a full stop), the engine confirms it sleeps
// and, with a VRAM check configured, the pool's GPU memory dropped. No lease
// is open: the pool drained it.
func (p *Pool) sleepOut(ctx context.Context, old *engine, retired bool) bool {
	p.mu.Lock()
	prof := p.cfg.Lookup(old.profile.ID)
	level, maxSleeping, budget, gpus := 0, p.spec.MaxSleeping, p.cfg.Defaults.SleepMemoryBudget, old.gpus
	if !retired && p.servesLocked(old.profile.ID) && old.runs(prof, p.spec, p.opts.Launch) {
		level = prof.SleepLevel()
	}
	p.mu.Unlock()
	select {
	case <-old.h.Exited():
		return false
	default:
	}
	if level == 0 || maxSleeping <= 0 {
		return false
	}
	var need int64
	if level == 1 {
		need = weightBytes(old.profile)
	}
	if !p.makeSleepRoom(old.profile.ID, maxSleeping, need, budget) {
		return false
	}
	p.mu.Lock()
	p.setStateLocked(StateSleeping)
	p.mu.Unlock()
	old.unwatchHealth()
	var released func() error
	if p.opts.VRAM != nil {
		released = p.opts.VRAM.WatchSleep(gpus, old.h.Members())
	}
	sctx, cancel := context.WithTimeout(ctx, old.profile.StopTimeout.Duration)
	err := old.api.Sleep(sctx, level)
	cancel()
	if err != nil {
		p.opts.host.release(need)
		if ctx.Err() != nil { // poold is stopping, or the pool was removed: not a failure
			p.log.Info("sleep abandoned: the pool is stopping; stopping the engine", "profile", old.profile.ID)
		} else {
			p.log.Warn("putting engine to sleep failed; stopping it", "profile", old.profile.ID, "err", err)
		}
		return false
	}
	if released != nil {
		if err := released(); err != nil { // a sleeper that frees nothing is worth nothing
			p.opts.host.release(need)
			p.log.Warn("sleeping engine's GPU memory not released; stopping it", "profile", old.profile.ID, "gpus", gpus, "err", err)
			if p.opts.Observer != nil {
				p.opts.Observer.SleepVRAMNotReleased(p.name)
			}
			return false
		}
	}
	sl := &sleeper{eng: old, level: level, since: p.opts.Now(), hostBytes: need, gone: make(chan struct{})}
	p.opts.Ledger.Asleep(old.h.PID(), level)
	p.mu.Lock()
	p.sleepers = append(p.sleepers, sl)
	if p.eng == old {
		p.eng = nil
	}
	p.watchSleeper(sl)
	p.mu.Unlock()
	p.log.Info("engine asleep", "profile", old.profile.ID, "level", level, "host_bytes", need)
	return true
}

// watchSleeper wakes the run loop when sl exits on its own while asleep.
func (p *Pool) watchSleeper(sl *sleeper) {
	go func() {
		select {
		case <-sl.eng.h.Exited():
			p.wake()
		case <-sl.gone:
		}
	}()
}

// sleepRoomAttempts bounds the decisions makeSleepRoom makes when other
// pools take the host's budget between its decision and its reservation.
const sleepRoomAttempts = 4

// makeSleepRoom evicts the sleepers that sleepRoom picks, with a full stop,
// and reserves need bytes of the host's budget for engine id, about to
// sleep. It reports whether there is room; without it, nothing was evicted
// or reserved and the engine is to be stopped instead.
func (p *Pool) makeSleepRoom(id string, maxSleeping int, need, budget int64) bool {
	for range sleepRoomAttempts {
		p.mu.Lock()
		evict, fits := sleepRoom(p.sleepers, maxSleeping, need, budget, p.opts.host.held.Load())
		if !fits {
			p.mu.Unlock()
			p.log.Info("no room for another sleeping engine; stopping instead", "profile", id, "max_sleeping", maxSleeping, "weight_bytes", need, "budget", budget)
			return false
		}
		for _, sl := range evict {
			p.removeSleeperLocked(sl)
		}
		p.mu.Unlock()
		for _, sl := range evict {
			p.stopSleeper(sl, "evicted (maxSleeping, sleepMemoryBudget)")
		}
		if p.opts.host.reserve(need, budget) {
			return true
		}
	}
	p.log.Info("the host's sleepMemoryBudget keeps changing; stopping instead", "profile", id, "weight_bytes", need, "budget", budget)
	return false
}

// removeSleeperLocked takes sl out of the list and accounts for it. p.mu
// must be held.
func (p *Pool) removeSleeperLocked(sl *sleeper) {
	if i := slices.Index(p.sleepers, sl); i >= 0 {
		p.sleepers = slices.Delete(p.sleepers, i, i+1)
		p.dropSleeper(sl)
		p.noteActivityLocked()
	}
}

// takeSleeperLocked removes and returns the sleeper of profile id, or nil.
// p.mu must be held.
func (p *Pool) takeSleeperLocked(id string) *sleeper {
	for _, sl := range p.sleepers {
		if sl.eng.profile.ID == id {
			p.removeSleeperLocked(sl)
			return sl
		}
	}
	return nil
}

// dropSleeper accounts for sl leaving the list.
func (p *Pool) dropSleeper(sl *sleeper) {
	close(sl.gone)
	p.opts.host.release(sl.hostBytes)
}

// hasSleeperLocked reports whether profile id sleeps in the pool. p.mu must be held.
func (p *Pool) hasSleeperLocked(id string) bool {
	for _, sl := range p.sleepers {
		if sl.eng.profile.ID == id {
			return true
		}
	}
	return false
}

// evictOldest stops the sleeper asleep the longest, if any, and reports
// whether there was one.
func (p *Pool) evictOldest(why string) bool {
	p.mu.Lock()
	if len(p.sleepers) == 0 {
		p.mu.Unlock()
		return false
	}
	sl := byAge(p.sleepers)[0]
	p.removeSleeperLocked(sl)
	p.mu.Unlock()
	p.stopSleeper(sl, "evicted ("+why+")")
	return true
}

// staleSleeperLocked takes out of the list and returns the first sleeper that
// must go: one that exited, whose profile a reload removed or changed, or
// beyond the pool's maxSleeping (lowered by a reload). p.mu must be held.
func (p *Pool) staleSleeperLocked() (*sleeper, string) {
	order := byAge(p.sleepers)
	for i, sl := range order {
		why := ""
		select {
		case <-sl.eng.h.Exited():
			why = "exited while asleep"
		default:
			id := sl.eng.profile.ID
			switch {
			case !p.servesLocked(id):
				why = "profile removed"
			case !sl.eng.runs(p.cfg.Lookup(id), p.spec, p.opts.Launch) || p.cfg.Lookup(id).SleepLevel() == 0 && !sl.self:
				why = "profile changed"
			case len(order)-i > p.spec.MaxSleeping:
				why = "maxSleeping"
			default:
				continue
			}
		}
		p.removeSleeperLocked(sl)
		return sl, why
	}
	return nil, ""
}

// stopSleeper stops a sleeper that left the list under the stop contract
// (group checked empty); one that exited has its group reaped.
func (p *Pool) stopSleeper(sl *sleeper, why string) {
	e := sl.eng
	reason, grace := exitStopped, e.profile.StopTimeout.Duration
	select {
	case <-e.h.Exited():
		reason, grace = statusapi.ExitCrashed, 0
		p.log.Error("sleeping engine exited", "profile", e.profile.ID, "err", e.failure())
	default:
		p.log.Info("stopping sleeping engine", "profile", e.profile.ID, "pid", e.h.PID(), "reason", why)
	}
	if _, err := p.stopAndForget(e, grace, reason); err != nil {
		p.log.Error("stopping sleeping engine", "profile", e.profile.ID, "err", err)
	}
}

// stopSleepers stops every sleeper, for shutdown.
func (p *Pool) stopSleepers() {
	for p.evictOldest("shutdown") {
	}
}

// sleepStatusLocked lists the sleepers for /status. p.mu must be held.
func (p *Pool) sleepStatusLocked() []statusapi.Sleeper {
	list := make([]statusapi.Sleeper, len(p.sleepers))
	for i, sl := range p.sleepers {
		list[i] = statusapi.Sleeper{Profile: sl.eng.profile.ID, Level: sl.level, Since: sl.since, HostBytes: sl.hostBytes, PID: sl.eng.h.PID(), Port: sl.eng.port, SelfSlept: sl.self}
	}
	return list
}

// wakeSleeper wakes sl, the sleeper of the profile the pool swaps to, as the
// pool's engine, and reports whether it serves now. A wake that fails (or a
// sleeper that died) is stopped, reported as a swap result "wake_failed",
// and the caller starts the profile cold; one cut short because the pool
// stops (ctx ended) is stopped, and that is no failure.
func (p *Pool) wakeSleeper(ctx context.Context, sl *sleeper, from string, phases map[string]time.Duration) bool {
	e, t := sl.eng, p.opts.Now()
	p.log.Info("waking engine", "profile", e.profile.ID, "level", sl.level, "asleep_for", t.Sub(sl.since))
	err := e.wakeUp(ctx, sl.level, e.profile.StartupTimeout.Duration)
	if err == nil {
		phases["wake"] = p.opts.Now().Sub(t)
		p.opts.Ledger.Asleep(e.h.PID(), 0)
		return true
	}
	abandoned := ctx.Err() != nil // poold is stopping, or the pool was removed: not a failure
	if abandoned {
		p.log.Info("wake abandoned: the pool is stopping; stopping the engine", "profile", e.profile.ID)
	} else {
		p.log.Warn("wake failed; starting cold instead", "profile", e.profile.ID, "err", err)
	}
	reason := statusapi.ExitLoadFailed
	if abandoned {
		reason = exitStopped
	}
	if _, stopErr := p.stopAndForget(e, e.profile.StopTimeout.Duration, reason); stopErr != nil {
		p.log.Error("stopping engine that failed to wake", "profile", e.profile.ID, "err", stopErr)
	}
	if abandoned {
		return false
	}
	p.observeSwap(from, e.profile.ID, KindWake, "wake_failed", phases)
	return false
}
