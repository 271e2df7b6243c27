package pool

import (
	"errors"
	"slices"
	"time"
)

// Scheduling errors a waiting request can get.
var (
	ErrQueueFull = errors.New("queue full")
	// ErrQueueBudget refuses a request that would queue while the host's
	// waiting requests already hold all the memory they may.
	ErrQueueBudget  = errors.New("the requests waiting on this host hold all the memory they may")
	ErrQueueTimeout = errors.New("timed out waiting for the model to load")
	// ErrNoSwap refuses a request that may not cause a swap (Waiter.NoSwap)
	// when its profile is neither loaded in the pool nor being loaded.
	ErrNoSwap = errors.New("the model is not loaded or loading in the pool, and the request may not swap it in")
)

// Waiter is one request queued on a pool. The scheduler reads its exported
// fields; the pool owns the rest.
type Waiter struct {
	// Profile is the profile wanted; "" (only with Intent) means an empty pool.
	Profile  string
	Priority int
	Arrived  time.Time
	// Intent marks an explicit load (of Profile) or unload (Profile "") from
	// the admin API rather than a request: it queues, is ordered and closes
	// the gate like a request, but holds no lease once admitted.
	Intent bool
	// Tenant, Weight and Background place the request in the weighted fair
	// queue of its profile, when that profile has an admission ceiling:
	// slots go to tenants in proportion to their weights (zero counts as
	// one), first come first served within a tenant, and to background
	// tenants only when no other waits (BackgroundAge aside).
	Tenant     string
	Weight     int
	Background bool
	// Hold, if not nil, is asked by the pool whether the request may queue,
	// when it cannot be admitted at once: a queued request holds memory (its
	// body) while it waits. It runs under the pool's mutex and must not
	// block; false refuses the request with ErrQueueBudget.
	Hold func() bool
	// NoSwap marks a request that may not cause a swap: it is served by its
	// profile where that is loaded or being loaded, never chooses the
	// profile loaded next, and is refused with ErrNoSwap when its profile
	// is neither, at arrival (Arrive) or once a swap or a crash takes the
	// profile away (Stranded). False: it may cause one, as any request.
	NoSwap bool

	done       chan grant // buffered(1); the pool sends exactly one grant
	causedSwap bool       // set by markSwapCause
}

// Decision is what the scheduler wants the pool to do next.
type Decision struct {
	// Admit are waiters admitted now: requests hold a lease (already counted in
	// flight), intents are done. Only when all of them are intents can a Load
	// or Unload come with them.
	Admit []*Waiter
	// Load, when non-empty, is the profile to swap to now: the pool has no lease
	// open, and the caller must call Begin(Load) and then Ready or Failed.
	Load string
	// Unload, when set, asks the pool to stop its engine and stay empty (an
	// unload intent goes next): no lease is open, and the caller must call
	// Begin("") and then Ready("") or Failed("").
	Unload bool
	// Release, when set, asks the pool to release its idle engine (put it
	// to sleep or stop it) and stay empty: no lease is open and nothing
	// waits, and the caller must call Begin("") and then Ready("") or
	// Failed(""). Requests that arrive meanwhile queue, and load the
	// profile again once the pool is empty.
	Release bool
	// Recheck, when non-zero, is when Next should be called again even if
	// nothing else happens.
	Recheck time.Time
}

// Scheduler decides, for one pool, which requests may use the engine now and
// which profile the pool should hold next. It is a pure decision object: it does
// no I/O, starts no goroutines and reads no clock (callers pass now). It is not
// safe for concurrent use; the pool calls it with its mutex held.
//
// The zero value, with a zero Policy, is an empty pool that swaps as soon as
// another profile is wanted.
type Scheduler struct {
	Policy Policy

	loaded   string // profile ready in the pool; "" when none
	target   string // profile being loaded; "" when none or unloading
	swapping bool   // between Begin and Ready or Failed
	readyAt  time.Time
	lastUsed time.Time // last admission or release of a lease
	closing  bool      // the gate is closed: the pool drains towards a swap
	inFlight int
	queue    []*Waiter // in arrival order
	// gaps is, per profile, the moving average of its gaps (LearnGrace);
	// nil until one is seen.
	gaps map[string]time.Duration
	// released is set when the last lease of the loaded profile ended: the
	// next arrival for it ends a gap. A load or a swap clears it.
	released bool
	// Start-time fair queueing over tenants, for profiles with a ceiling:
	// vtime is the start tag of the request admitted last; finish, per
	// tenant, the finish tag of its last admitted request.
	vtime  float64
	finish map[string]float64
	// keep is what the last request to end asked of the loaded profile's
	// stay once idle (Policy.stay reads it under the policy in force, so
	// that a reload's applies at once); Ready clears it.
	keep KeepAlive
}

// Arrive admits w at once (true) when its profile is ready (for an unload
// intent: the pool is empty) and the gate is open; otherwise it queues w
// (false), or refuses it with ErrQueueFull, or, when w may not cause a swap
// and its profile is neither loaded nor loading, with ErrNoSwap. An
// admitted request holds a lease; an admitted intent is simply done.
func (s *Scheduler) Arrive(w *Waiter) (bool, error) {
	if s.Admits(w) {
		if !w.Intent {
			if s.inFlight == 0 && s.released && s.Policy.LearnGrace {
				s.noteGap(w.Profile, w.Arrived.Sub(s.lastUsed))
			}
			if s.Policy.ceiling(w.Profile) > 0 {
				s.charge(w)
			}
			s.inFlight++
			s.lastUsed = w.Arrived
		}
		return true, nil
	}
	if w.NoSwap && !s.serves(w.Profile) {
		return false, ErrNoSwap
	}
	if s.Policy.MaxQueue > 0 && len(s.queue) >= s.Policy.MaxQueue {
		return false, ErrQueueFull
	}
	s.queue = append(s.queue, w)
	return false, nil
}

// Admits reports whether Arrive would admit w at once rather than queue it:
// its profile is ready, the gate open, and, under a ceiling, a slot is free
// and no earlier request of the profile waits for one.
func (s *Scheduler) Admits(w *Waiter) bool {
	if s.swapping || w.Profile != s.loaded || s.gateClosed(w.Arrived) {
		return false
	}
	if c := s.Policy.ceiling(w.Profile); c > 0 && !w.Intent && (s.inFlight >= c || s.Queued(w.Profile)) {
		return false
	}
	return true
}

// Cancel removes a queued waiter and reports whether it was still queued (false
// means it was already admitted or failed).
func (s *Scheduler) Cancel(w *Waiter) bool {
	for i, q := range s.queue {
		if q == w {
			s.queue = slices.Delete(s.queue, i, i+1)
			return true
		}
	}
	return false
}

// Stranded removes and returns the queued requests that may not cause a
// swap (Waiter.NoSwap) whose profile is neither loaded nor being loaded any
// more, after a swap to another began or the engine was lost: the pool
// answers them with ErrNoSwap. Call it after Begin and Lost: until then
// they wait, and count as demand for another profile in the gate.
func (s *Scheduler) Stranded() []*Waiter {
	var out []*Waiter
	for _, w := range s.queue {
		if w.NoSwap && !s.serves(w.Profile) {
			out = append(out, w)
		}
	}
	for _, w := range out {
		s.Cancel(w)
	}
	return out
}

// serves reports whether profile is loaded in the pool or being loaded.
func (s *Scheduler) serves(profile string) bool {
	return profile == s.loaded || s.swapping && profile == s.target
}

// Release ends one lease, whose request asked k of the loaded profile's
// stay: the last request to end sets how long the engine stays idle (its
// keep_alive, or, when it asked none, the idle timeout), as in Ollama.
func (s *Scheduler) Release(now time.Time, k KeepAlive) {
	s.inFlight--
	s.lastUsed = now
	s.released = s.inFlight == 0
	s.keep = k
}

// ReleaseAt is when the loaded profile's engine is to be released, and
// false when no release is due: none is set, a request is in flight or
// waits, or a swap is under way. The stay counts from the end of the last
// request (from Ready, when none came).
func (s *Scheduler) ReleaseAt() (time.Time, bool) {
	if s.loaded == "" || s.swapping || s.closing || s.inFlight > 0 || len(s.queue) > 0 {
		return time.Time{}, false
	}
	d, forever := s.Policy.stay(s.loaded, s.keep)
	if forever {
		return time.Time{}, false
	}
	return s.lastUsed.Add(d), true
}

// Next decides what the pool should do now.
func (s *Scheduler) Next(now time.Time) Decision {
	if s.swapping {
		return Decision{}
	}
	if at, ok := s.ReleaseAt(); ok {
		if now.Before(at) {
			return Decision{Recheck: at}
		}
		return Decision{Release: true}
	}
	if s.loaded != "" && !s.hasOthers() {
		// Only waiters for the loaded profile remain, or none (those for
		// others left): there is nothing to drain for, so reopen the gate and
		// admit them, even while leases are still open.
		s.closing = false
		return Decision{Admit: s.admit(s.loaded, now)}
	}
	if len(s.queue) == 0 {
		return Decision{}
	}
	if s.loaded != "" && !s.closing {
		residencyEnd := s.readyAt.Add(s.Policy.residency(s.loaded))
		idleAt := s.lastUsed.Add(s.IdleGrace())
		idle := s.inFlight == 0 && !now.Before(idleAt)
		if now.Before(residencyEnd) && !idle {
			// The gate stays open: requests of the loaded profile waiting
			// for a slot under its ceiling go in as slots free.
			d := Decision{Recheck: residencyEnd, Admit: s.admit(s.loaded, now)}
			if s.inFlight == 0 && idleAt.Before(residencyEnd) {
				d.Recheck = idleAt
			}
			return d
		}
		s.closing = true
	}
	if s.inFlight > 0 {
		return Decision{}
	}
	var d Decision
	// Each turn admits at least one waiter, and only intents (which take no
	// lease) let it go round again, so this ends.
	for len(s.queue) > 0 {
		next, ok := s.pick()
		if !ok {
			return d // only requests that Stranded would take wait
		}
		if next != s.loaded {
			d.Load, d.Unload = next, next == ""
			return d
		}
		s.closing = false
		d.Admit = append(d.Admit, s.admit(next, now)...)
		if s.inFlight > 0 {
			return d
		}
	}
	return d
}

// Begin records that a swap to profile ("" for an unload) has started: the old
// profile is gone.
func (s *Scheduler) Begin(profile string) {
	s.loaded, s.target, s.closing, s.swapping = "", profile, false, true
	s.released = false
}

// Ready records that profile is serving (for "": that the unload is done) and
// admits all of its waiters together.
func (s *Scheduler) Ready(profile string, now time.Time) []*Waiter {
	s.loaded, s.target, s.closing, s.swapping = profile, "", false, false
	s.readyAt, s.lastUsed = now, now
	s.keep = KeepAlive{}
	return s.admit(profile, now)
}

// Failed records that loading profile (unloading, for "") failed and removes
// its waiters, which the pool must answer with the failure.
func (s *Scheduler) Failed(profile string) []*Waiter {
	s.loaded, s.target, s.closing, s.swapping = "", "", false, false
	return s.take(profile)
}

// Lost records that the loaded engine went away on its own (it exited).
func (s *Scheduler) Lost() {
	s.loaded, s.closing = "", false
}

// Drop removes every waiter (for shutdown or a removed profile when profile is
// non-empty) and returns them for the pool to answer.
func (s *Scheduler) Drop(profile string) []*Waiter {
	if profile != "" {
		return s.take(profile)
	}
	q := s.queue
	s.queue = nil
	return q
}

// noteGap folds one gap of profile's requests into its moving average.
func (s *Scheduler) noteGap(profile string, gap time.Duration) {
	gap = max(0, min(gap, s.Policy.residency(profile)))
	if s.gaps == nil {
		s.gaps = make(map[string]time.Duration)
	}
	avg, seen := s.gaps[profile]
	if !seen {
		avg = gap
	}
	s.gaps[profile] = time.Duration(gapWeight*float64(gap) + (1-gapWeight)*float64(avg))
}

// IdleGrace is how long after its last use the loaded profile still counts
// as in demand (see Policy.LearnGrace).
func (s *Scheduler) IdleGrace() time.Duration {
	floor := s.Policy.IdleGrace
	avg, seen := s.gaps[s.loaded]
	if !s.Policy.LearnGrace || !seen {
		return floor
	}
	return max(floor, min(graceFactor*avg, s.Policy.residency(s.loaded)))
}

// Loaded is the profile ready in the pool, or "".
func (s *Scheduler) Loaded() string { return s.loaded }

// Target is the profile being loaded, or "".
func (s *Scheduler) Target() string { return s.target }

// Swapping reports whether a load or unload is under way.
func (s *Scheduler) Swapping() bool { return s.swapping }

// InFlight is the number of open leases.
func (s *Scheduler) InFlight() int { return s.inFlight }

// Closing reports whether the gate is closed and the pool drains towards a swap.
func (s *Scheduler) Closing() bool { return s.closing }

// LastUsed is when a lease was last taken or returned.
func (s *Scheduler) LastUsed() time.Time { return s.lastUsed }

// Waiting counts the queued waiters by profile, explicit loads included (they
// are demand for their profile), unloads not (they have none), and returns the
// oldest arrival among them.
func (s *Scheduler) Waiting() (map[string]int, time.Time) {
	m := make(map[string]int)
	var oldest time.Time
	for _, w := range s.queue {
		if w.Profile == "" {
			continue
		}
		m[w.Profile]++
		if oldest.IsZero() || w.Arrived.Before(oldest) {
			oldest = w.Arrived
		}
	}
	return m, oldest
}

// Queued reports whether any waiter wants profile.
func (s *Scheduler) Queued(profile string) bool {
	for _, w := range s.queue {
		if w.Profile == profile {
			return true
		}
	}
	return false
}

// QueueLen is the number of waiters.
func (s *Scheduler) QueueLen() int { return len(s.queue) }

// gateClosed reports whether a request for the loaded profile must queue: the
// pool is draining, or its residency is over while other profiles wait.
func (s *Scheduler) gateClosed(now time.Time) bool {
	if s.closing {
		return true
	}
	return s.hasOthers() && !now.Before(s.readyAt.Add(s.Policy.residency(s.loaded)))
}

func (s *Scheduler) hasOthers() bool {
	for _, w := range s.queue {
		if w.Profile != s.loaded {
			return true
		}
	}
	return false
}

// pick returns the profile of the waiter that goes next: the oldest arrival,
// each priority level counting as PriorityAge of extra waiting, among those
// that may cause a swap or want the loaded profile; false when none does.
func (s *Scheduler) pick() (string, bool) {
	var best *Waiter
	var bestAt time.Time
	for _, w := range s.queue {
		at := w.Arrived.Add(-time.Duration(w.Priority) * s.Policy.PriorityAge)
		if (!w.NoSwap || w.Profile == s.loaded) && (best == nil || at.Before(bestAt)) {
			best, bestAt = w, at
		}
	}
	if best == nil {
		return "", false
	}
	return best.Profile, true
}

// admit removes profile's waiters from the queue, as many as its ceiling
// lets in, and counts its requests in flight. Intents take no slot and all
// go; requests go in fair order (nextFair).
func (s *Scheduler) admit(profile string, now time.Time) []*Waiter {
	ceiling := s.Policy.ceiling(profile)
	if ceiling <= 0 {
		ws := s.take(profile)
		for _, w := range ws {
			if !w.Intent {
				s.inFlight++
				s.lastUsed = now
			}
		}
		return ws
	}
	var ws []*Waiter
	for _, w := range s.queue {
		if w.Profile == profile && w.Intent {
			ws = append(ws, w)
		}
	}
	for _, w := range ws {
		s.Cancel(w)
	}
	for s.inFlight < ceiling {
		w := s.nextFair(profile, now)
		if w == nil {
			break
		}
		s.Cancel(w)
		s.charge(w)
		s.inFlight++
		s.lastUsed = now
		ws = append(ws, w)
	}
	return ws
}

// nextFair returns the waiting request of profile that goes next, or nil:
// among the tenants with a request waiting (the oldest of each; background
// tenants only when no other waits, unless theirs has waited
// BackgroundAge), the one whose start tag, max(vtime, its last finish tag),
// is least; ties go to the earlier arrival.
func (s *Scheduler) nextFair(profile string, now time.Time) *Waiter {
	var best, bestBg *Waiter
	var bestTag, bestBgTag float64
	seen := make(map[string]bool)
	for _, w := range s.queue {
		if w.Profile != profile || w.Intent || seen[w.Tenant] {
			continue
		}
		seen[w.Tenant] = true // the queue is in arrival order: this is the tenant's oldest
		tag := max(s.vtime, s.finish[w.Tenant])
		if w.Background && now.Sub(w.Arrived) < s.Policy.BackgroundAge {
			if bestBg == nil || tag < bestBgTag {
				bestBg, bestBgTag = w, tag
			}
			continue
		}
		if best == nil || tag < bestTag {
			best, bestTag = w, tag
		}
	}
	if best == nil {
		return bestBg
	}
	return best
}

// charge advances the fair queue's tags for w, admitted now.
func (s *Scheduler) charge(w *Waiter) {
	if s.finish == nil {
		s.finish = make(map[string]float64)
	}
	start := max(s.vtime, s.finish[w.Tenant])
	s.vtime = start
	s.finish[w.Tenant] = start + 1/float64(max(1, w.Weight))
}

func (s *Scheduler) take(profile string) []*Waiter {
	var taken []*Waiter
	kept := s.queue[:0]
	for _, w := range s.queue {
		if w.Profile == profile {
			taken = append(taken, w)
		} else {
			kept = append(kept, w)
		}
	}
	clear(s.queue[len(kept):])
	s.queue = kept
	return taken
}
