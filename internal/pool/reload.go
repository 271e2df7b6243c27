package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/poold/poold/internal/profile"
)

// reloadStep is what a profiles reload left for the run loop to do; the zero
// value is nothing.
type reloadStep int

const (
	reloadNone reloadStep = iota
	// reloadRecheck: a swap was under way when the profiles changed; the
	// engine it brings up is checked against them once it is over.
	reloadRecheck
	// reloadRetire: the loaded engine's profile was removed, or changed in a
	// way that changes its command line or environment. The engine takes no
	// new lease and is stopped once its last lease ends; then next, if set,
	// is loaded (the changed profile, restarted).
	reloadRetire
	// reloadPreload: next (a new default) is loaded once the pool is idle.
	reloadPreload
	// reloadRemove: a reload removed the pool; the run loop ends once its
	// last lease has.
	reloadRemove
)

// pendingReload is a reload's pending step and the profile it loads next;
// the zero value is nothing pending.
type pendingReload struct {
	step reloadStep
	next string // a profile id to load once the pool is idle; "" for none
}

// Refusals caused by a reload.
var (
	// ErrProfileRemoved answers a request for a profile that a reload removed
	// (or took off the pool) while the request was on its way or queued.
	ErrProfileRemoved = errors.New("model removed by a profiles reload")
	// ErrPoolRemoved answers a request placed on a pool that a reload removed.
	ErrPoolRemoved = errors.New("pool removed by a profiles reload")
)

// Apply makes the set serve cfg, a newly loaded and validated profiles file,
// without cutting any request in flight:
//   - a pool whose spec and profiles did not change is left alone;
//   - an engine whose profile changed in a way that changes its command line
//     or environment drains (new requests for it queue) and is restarted with
//     the new definition once its last lease ends;
//   - an engine whose profile was removed, or may no longer run on its pool,
//     drains and is stopped; queued requests for a removed profile get
//     ErrProfileRemoved at once;
//   - new profiles are servable as soon as Apply returns;
//   - an empty pool whose default changed preloads the new default;
//   - an added pool starts (and preloads its default), and a removed pool
//     refuses new requests, drains, and stops its engine.
//
// Apply returns one line per change, for the log. It may run before or after
// Run; calls are serialised.
func (s *Set) Apply(cfg *profile.Config) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.list.Load()
	next := &poolList{by: make(map[string]*Pool, len(cfg.Pools))}
	var notes []string
	for _, spec := range cfg.Pools {
		p := old.by[spec.Name]
		if p != nil {
			notes = append(notes, p.update(spec, cfg)...)
		} else {
			p = newPool(spec, cfg, s.opts)
			notes = append(notes, fmt.Sprintf("pool %q: added", spec.Name))
			if s.ctx != nil {
				s.start(p)
			}
		}
		next.all = append(next.all, p)
		next.by[spec.Name] = p
	}
	s.list.Store(next)
	for _, p := range old.all {
		if next.by[p.name] == nil {
			p.remove()
			notes = append(notes, fmt.Sprintf("pool %q: removed: draining, then stopping", p.name))
		}
	}
	return notes
}

// update gives the pool its new spec and profiles and returns what changes.
func (p *Pool) update(spec *profile.PoolSpec, cfg *profile.Config) []string {
	p.mu.Lock()
	oldDefault, oldCfg := p.spec.Default, p.cfg
	p.spec, p.cfg = spec, cfg
	p.sched.Policy = policyFor(spec, cfg)
	var notes []string
	// Whatever waits for a profile this pool no longer serves (requests and
	// admin intents alike) is refused now: the loop must never be asked to
	// load it.
	for _, old := range oldCfg.Profiles {
		if p.sched.Queued(old.ID) && !p.servesLocked(old.ID) {
			p.answerLocked(p.sched.Drop(old.ID), ErrProfileRemoved)
			notes = append(notes, fmt.Sprintf("pool %q: profile %q removed: its queued requests are refused", p.name, old.ID))
		}
	}
	if p.sched.Swapping() {
		// The engine being loaded is checked once it is ready.
		p.reload = pendingReload{step: reloadRecheck}
	} else if n := p.reconcileLocked(); n != "" {
		notes = append(notes, n)
	}
	if spec.Default != oldDefault && spec.Default != "" && p.eng == nil && !p.sched.Swapping() && p.sched.QueueLen() == 0 {
		if def := cfg.Lookup(spec.Default); def != nil {
			p.reload = pendingReload{step: reloadPreload, next: def.ID}
			notes = append(notes, fmt.Sprintf("pool %q: default %q: preloading", p.name, def.ID))
		}
	}
	p.mu.Unlock()
	p.wake()
	return notes
}

// servesLocked reports whether the pool may serve profile id under its
// current profiles. p.mu must be held.
func (p *Pool) servesLocked(id string) bool {
	prof := p.cfg.Lookup(id)
	return prof != nil && prof.ID == id && prof.EligibleOn(p.name)
}

// reconcileLocked compares the loaded engine with the current profiles and,
// when its profile was removed or its command line or environment changed,
// retires it: new requests for it queue, and the run loop stops it once its
// last lease ends (restarting it with the new definition if it changed). It
// returns a line for the log, or "" when the engine stays. p.mu must be held
// and no swap may be under way.
func (p *Pool) reconcileLocked() string {
	e := p.eng
	if e == nil || p.reload.step == reloadRetire || p.sched.Loaded() != e.profile.ID {
		return ""
	}
	id := e.profile.ID
	var note string
	switch prof := p.cfg.Lookup(id); {
	case !p.servesLocked(id):
		p.reload = pendingReload{step: reloadRetire}
		note = fmt.Sprintf("pool %q: loaded profile %q removed: draining, then stopping", p.name, id)
	case !e.runs(prof, p.spec, p.opts.Launch):
		p.reload = pendingReload{step: reloadRetire, next: id}
		note = fmt.Sprintf("pool %q: loaded profile %q changed: draining, then restarting", p.name, id)
	default:
		return ""
	}
	// The loaded profile is no longer servable by this engine: like an engine
	// that went away, except that its open leases run on until they end.
	p.sched.Lost()
	p.setStateLocked(StateDraining)
	return note
}

// reloadStepLocked is the run loop's share of reloads, called with p.mu held
// before each scheduling decision. Once the pool is otherwise idle (no swap,
// no lease, nobody queued, nothing servable loaded) it returns what to do: end
// the loop of a removed pool (the step returns false), load a wanted profile
// (a restart or a new default), or stop a retired engine. It returns nil when
// there is nothing to do.
func (p *Pool) reloadStepLocked() func(context.Context) bool {
	s := &p.sched
	if s.Swapping() {
		return nil
	}
	if p.reload.step == reloadRecheck {
		p.reload = pendingReload{}
		p.reconcileLocked()
	}
	if p.reload.step == reloadRetire && p.eng == nil {
		// The retired engine exited by itself: what remains is to load next.
		p.reload.step = reloadPreload
	}
	if s.InFlight() > 0 || s.QueueLen() > 0 {
		return nil
	}
	if p.reload.step == reloadRemove {
		return func(context.Context) bool { return false }
	}
	if s.Loaded() != "" {
		return nil
	}
	if p.reload.next != "" {
		prof := p.cfg.Lookup(p.reload.next)
		p.reload.next = ""
		if prof != nil {
			retired := p.beginLocked(prof.ID) // a retired engine is stopped first
			return func(ctx context.Context) bool { p.swap(ctx, prof, retired); return true }
		}
	}
	switch p.reload.step {
	case reloadRetire:
		e := p.eng
		p.reload = pendingReload{}
		p.setStateLocked(StateStopping)
		return func(context.Context) bool { p.stopRetired(e); return true }
	case reloadPreload:
		p.reload = pendingReload{} // its profile is gone
	}
	return nil
}

// stopRetired stops an engine whose profile a reload removed, leaving the pool
// empty (or failed, if the stop fails).
func (p *Pool) stopRetired(e *engine) {
	_, err := p.stopEngine(e)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.log.Error("stopping retired engine", "profile", e.profile.ID, "err", err)
		p.lastErr = err
		p.setStateLocked(StateFailed)
		return
	}
	p.log.Info("retired engine stopped", "profile", e.profile.ID)
	p.setStateLocked(StateEmpty)
}

// remove takes the pool out of service: queued and new requests get
// ErrPoolRemoved, a load under way is abandoned, and the run loop ends (and
// stops the engine) once the last lease has ended.
func (p *Pool) remove() {
	p.mu.Lock()
	p.reload = pendingReload{step: reloadRemove}
	p.refuseLocked(ErrPoolRemoved)
	loading := p.sched.Swapping()
	p.mu.Unlock()
	if loading {
		p.cancel() // no lease is open while a pool loads
	}
	p.wake()
}
