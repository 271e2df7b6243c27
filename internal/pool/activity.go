package pool

import (
	"slices"
	"strings"
	"time"
)

// Activity is what a pool's GPUs are doing, as usage accounting sees it
// (docs/usage.md). It is derived from the pool's state, its open leases and
// its sleepers, so that every moment of a pool's life has exactly one.
type Activity string

// The activities. ActivityNone is not a state of the GPUs: it reports that
// the pool's run loop has ended (shutdown, or the pool was removed).
const (
	ActivityServing  Activity = "serving"  // at least one lease is open
	ActivityIdle     Activity = "idle"     // an engine is ready, no lease is open
	ActivitySwapping Activity = "swapping" // draining with no lease left, stopping, starting, waking or putting to sleep
	ActivityAsleep   Activity = "asleep"   // no engine awake, at least one asleep
	ActivityEmpty    Activity = "empty"    // no engine at all (also after a failure)
	ActivityNone     Activity = ""
)

// ActivityObserver receives a pool's activity each time it changes, in
// order, with the moment of the change on the pool's clock: the first call
// when the run loop starts, ActivityNone when it has ended. profile is the
// profile serving or idle; while swapping, the one being loaded (or stopped
// at shutdown; none for an unload); while asleep, the sleeping profiles
// joined by ","; empty otherwise. gpus is the pool's GPU list: read it,
// never modify it.
//
// It is called with the pool's lock held, on request goroutines and the run
// loop: it must not block nor call back into the pool.
type ActivityObserver interface {
	PoolActivity(pool string, gpus []int, a Activity, profile string, at time.Time)
}

// activityLocked is the pool's activity now and its profile. p.mu must be held.
func (p *Pool) activityLocked() (Activity, string) {
	s := &p.sched
	switch {
	case s.InFlight() > 0:
		return ActivityServing, s.Loaded()
	case p.state == StateReady && !s.Swapping():
		return ActivityIdle, s.Loaded()
	case p.state == StateEmpty || p.state == StateFailed:
		if len(p.sleepers) == 0 {
			return ActivityEmpty, ""
		}
		ids := make([]string, len(p.sleepers))
		for i, sl := range p.sleepers {
			ids[i] = sl.eng.profile.ID
		}
		slices.Sort(ids)
		return ActivityAsleep, strings.Join(ids, ",")
	case s.Swapping():
		return ActivitySwapping, s.Target()
	default: // draining with no lease left: the swap starts now
		return ActivitySwapping, s.Loaded()
	}
}

// noteActivityLocked tells the observer when the pool's activity changed.
// Every change of state, leases or sleepers calls it. p.mu must be held.
func (p *Pool) noteActivityLocked() {
	if p.opts.Activity == nil {
		return
	}
	a, prof := p.activityLocked()
	if a == p.activity && prof == p.activityProfile {
		return
	}
	p.activity, p.activityProfile = a, prof
	p.opts.Activity.PoolActivity(p.name, p.spec.GPUs, a, prof, p.opts.Now())
}

// endActivity reports that the run loop has ended.
func (p *Pool) endActivity() {
	if p.opts.Activity == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.activity, p.activityProfile = ActivityNone, ""
	p.opts.Activity.PoolActivity(p.name, p.spec.GPUs, ActivityNone, "", p.opts.Now())
}

// markSwapCause marks the request that caused the swap that admits ws: the
// oldest of them, as the scheduler picks the profile of its oldest waiter.
// An explicit load (an intent) causes a swap no request is charged with.
func markSwapCause(ws []*Waiter) {
	if len(ws) > 0 && !ws[0].Intent {
		ws[0].causedSwap = true
	}
}
