// Package activity names what a pool's GPUs are doing, as usage accounting
// sees it (docs/usage.md): the vocabulary the pools report in and the usage
// ledger records, kept apart from both so that neither depends on the other.
package activity

import "time"

// Activity is what a pool's GPUs are doing. A pool derives it from its
// state, its open leases and its sleepers, so that every moment of its life
// has exactly one.
type Activity string

// The activities. None is not a state of the GPUs: it reports that the
// pool's run loop has ended (shutdown, or the pool was removed).
const (
	Serving  Activity = "serving"  // at least one lease is open
	Idle     Activity = "idle"     // an engine is ready, no lease is open
	Swapping Activity = "swapping" // draining with no lease left, stopping, starting, waking or putting to sleep
	Asleep   Activity = "asleep"   // no engine awake, at least one asleep
	Empty    Activity = "empty"    // no engine at all (also after a failure)
	None     Activity = ""
)

// Observer receives a pool's activity each time it changes, in order, with
// the moment of the change on the pool's clock: the first call when the run
// loop starts, None when it has ended. profile is the profile serving or
// idle; while swapping, the one being loaded (or stopped at shutdown; none
// for an unload); while asleep, the sleeping profiles joined by ","; empty
// otherwise. gpus is the pool's GPU list: read it, never modify it.
//
// It is called with the pool's lock held, on request goroutines and the run
// loop: it must not block nor call back into the pool.
type Observer interface {
	PoolActivity(pool string, gpus []int, a Activity, profile string, at time.Time)
}
