package pool

import (
	"slices"
	"strings"

	"github.com/poold/poold/internal/activity"
)

// activityLocked is the pool's activity now and its profile. p.mu must be held.
func (p *Pool) activityLocked() (activity.Activity, string) {
	s := &p.sched
	switch {
	case s.InFlight() > 0:
		return activity.Serving, s.Loaded()
	case p.state == StateReady && !s.Swapping():
		return activity.Idle, s.Loaded()
	case p.state == StateEmpty || p.state == StateFailed:
		if len(p.sleepers) == 0 {
			return activity.Empty, ""
		}
		ids := make([]string, len(p.sleepers))
		for i, sl := range p.sleepers {
			ids[i] = sl.eng.profile.ID
		}
		slices.Sort(ids)
		return activity.Asleep, strings.Join(ids, ",")
	case s.Swapping():
		return activity.Swapping, s.Target()
	default: // draining with no lease left: the swap starts now
		return activity.Swapping, s.Loaded()
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
	p.activity, p.activityProfile = activity.None, ""
	p.opts.Activity.PoolActivity(p.name, p.spec.GPUs, activity.None, "", p.opts.Now())
}

// markSwapCause marks the request that caused the swap that admits ws: the
// oldest of them, as the scheduler picks the profile of its oldest waiter.
// An explicit load (an intent) causes a swap no request is charged with.
func markSwapCause(ws []*Waiter) {
	if len(ws) > 0 && !ws[0].Intent {
		ws[0].causedSwap = true
	}
}
