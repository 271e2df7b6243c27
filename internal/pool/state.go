package pool

import (
	"fmt"
	"testing"
)

// transitions is the pool's state machine: for each state, the states it may
// move to. Staying in a state is always allowed (and changes nothing). The
// run loop, the only goroutine that starts or stops engines, makes most of
// them; Lease.Fail (Failed), the self-sleep check (Sleeping) and a reload
// (Draining) make the others, on an engine that serves.
var transitions = map[State][]State{
	// Nothing runs: a swap starts an engine (the pool's first, or after an
	// unload or release); an adopted engine serves at once.
	StateEmpty: {StateStarting, StateReady},
	// An engine starts or wakes: it serves, or the swap failed.
	StateStarting: {StateReady, StateFailed},
	// An engine serves: its gate closes for a swap or a reload (Draining), a
	// swap, unload or release stops it or puts it to sleep (Stopping), it
	// failed or exited (Failed), it fell asleep by itself (Sleeping), or
	// poold let go of it for the next poold (Empty, Set.Detach).
	StateReady: {StateDraining, StateStopping, StateFailed, StateSleeping, StateEmpty},
	// As Ready; and its gate reopened (Ready).
	StateDraining: {StateReady, StateStopping, StateFailed, StateSleeping, StateEmpty},
	// An engine is stopped or put to sleep: it sleeps (Sleeping), the swap
	// goes on to start the next (Starting), an unload, release or retire
	// ended (Empty), or the stop failed (Failed).
	StateStopping: {StateSleeping, StateStarting, StateEmpty, StateFailed},
	// An engine is put to sleep, or fell asleep by itself: the swap goes on
	// to the next (Starting), the release or self-sleep ended (Empty), the
	// stop after a failed sleep failed (Failed), or poold shuts down
	// (Stopping).
	StateSleeping: {StateStarting, StateEmpty, StateFailed, StateStopping},
	// A start, stop or engine failed: the next swap starts one (Starting),
	// poold shuts down with the failed engine not yet stopped (Stopping), or
	// lets go of it for the next poold (Empty).
	StateFailed: {StateStarting, StateStopping, StateEmpty},
}

// checkTransition reports whether the pool may move from one state to the
// other: nil when the table allows it, else an error naming both.
func checkTransition(from, to State) error {
	if from == to {
		return nil
	}
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return fmt.Errorf("invalid pool state transition from %q to %q", from, to)
}

// setStateLocked moves the pool to s, when the state machine allows it
// (checkTransition). An invalid transition is a bug: it is logged as an
// error and refused, the state staying as it was; in a test binary it then
// panics, so that no test passes over one, whichever logger its pool has
// and whatever goroutine made it. p.mu must be held.
func (p *Pool) setStateLocked(s State) {
	if p.state == s {
		return
	}
	if err := checkTransition(p.state, s); err != nil {
		p.log.Error("refused the pool's state change", "err", err)
		if testing.Testing() {
			panic(fmt.Sprintf("pool %q: %v", p.name, err))
		}
		return
	}
	if s == StateDraining {
		p.drainedAt = p.opts.Now()
	}
	p.state = s
	p.since = p.opts.Now()
	p.noteActivityLocked()
}
