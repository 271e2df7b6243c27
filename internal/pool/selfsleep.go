package pool

import (
	"context"
	"errors"
	"net/url"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
)

// Engines that fall asleep by themselves. The newest vLLM servers can put an
// idle engine to sleep without a call from poold, which only its metrics
// (vllm:engine_sleep_state) and /is_sleeping then tell. The engine-metrics
// scraper reports such a sample (Set.EngineAsleep); the pool confirms it
// with /is_sleeping, stops admitting to the engine at once and has its run
// loop take the engine for one of its sleepers (adoptSelfSleeper), so that
// the next request wakes it through the wake path of any sleeper (/wake_up,
// /is_sleeping, readiness, warm-up) before it is forwarded: poold does not
// rely on the engine waking by itself for a request.

// Actions on an engine that fell asleep by itself (Observer.EngineSelfSlept).
const (
	SelfSleepWake = "wake" // taken for a sleeper: the next request wakes it
	SelfSleepNone = "none" // it serves no sleep endpoints: poold can only report it
)

// EngineAsleep tells pool that its engine, pid on port, said in its metrics
// that it sleeps at level (enginestats.Options.Asleep). A pool that serves
// that engine asks it (/is_sleeping, bounded by the probe timeout) and,
// when it sleeps, takes it for a sleeper; an engine without the sleep
// endpoints is reported (logged once, and counted) and left serving. Other
// engines, and pools that are swapping, ignore it.
func (s *Set) EngineAsleep(pool string, pid, port, level int) {
	if p := s.Pool(pool); p != nil {
		p.engineAsleep(pid, port, level)
	}
}

func (p *Pool) engineAsleep(pid, port, level int) {
	p.mu.Lock()
	e := p.eng
	ok := e != nil && e.h.PID() == pid && e.port == port && p.servingLocked(e)
	p.mu.Unlock()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), proc.ProbeTimeout)
	asleep, err := e.api.IsSleeping(ctx)
	cancel()
	var transport *url.Error
	if errors.As(err, &transport) || err == nil && !asleep {
		return // no answer (the next sample asks again), or awake again
	}
	p.mu.Lock()
	if p.eng != e || !p.servingLocked(e) {
		p.mu.Unlock()
		return
	}
	if err != nil {
		p.mu.Unlock()
		if e.unwakeable.CompareAndSwap(false, true) {
			p.log.Warn("engine says it sleeps by itself, and poold cannot wake it (no sleep endpoints); requests go on to it as it is",
				"profile", e.profile.ID, "pid", e.h.PID(), "level", level, "err", err)
			p.observeSelfSleep(SelfSleepNone)
		}
		return
	}
	p.selfSlept = level
	// No new lease on it: requests for its profile queue for the wake.
	p.sched.Lost()
	p.setStateLocked(StateSleeping)
	p.mu.Unlock()
	p.log.Info("engine fell asleep by itself; the next request wakes it", "profile", e.profile.ID, "pid", e.h.PID(), "level", level)
	p.observeSelfSleep(SelfSleepWake)
	p.wake()
}

// servingLocked reports whether e is the pool's engine serving its loaded
// profile, with no failure or self-sleep pending. p.mu must be held.
func (p *Pool) servingLocked(e *engine) bool {
	return p.eng == e && p.sched.Loaded() == e.profile.ID && p.failed == nil && p.selfSlept == 0
}

// adoptSelfSleeper moves the engine that fell asleep by itself
// (engineAsleep) to the pool's sleepers, at the level it reported, and
// leaves the pool empty. Its host RAM (its weights, at level 1) is counted
// as held whatever the sleepMemoryBudget: it is held already. Only the run
// loop calls it.
func (p *Pool) adoptSelfSleeper() {
	p.mu.Lock()
	e, level := p.eng, p.selfSlept
	p.selfSlept = 0
	p.mu.Unlock()
	if e == nil {
		return
	}
	e.unwatchHealth()
	var need int64
	if level == 1 {
		need = weightBytes(e.profile)
	}
	p.opts.host.reserve(need, 0)
	p.opts.Ledger.Asleep(e.h.PID(), level)
	sl := &sleeper{eng: e, level: level, since: p.opts.Now(), hostBytes: need, self: true, gone: make(chan struct{})}
	p.mu.Lock()
	p.sleepers = append(p.sleepers, sl)
	p.eng = nil
	p.setStateLocked(StateEmpty)
	p.watchSleeper(sl)
	p.mu.Unlock()
	p.log.Info("engine asleep", "profile", e.profile.ID, "level", level, "host_bytes", need, "by_itself", true)
}

func (p *Pool) observeSelfSleep(action string) {
	if p.opts.Observer != nil {
		p.opts.Observer.EngineSelfSlept(p.name, action)
	}
}
