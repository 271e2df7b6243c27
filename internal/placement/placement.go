// Package placement ranks the GPU pools that could serve a model: how soon
// each could serve it, and at what cost to others. poold's pool set uses it
// to choose a pool of its host, fleetd to choose a pool, and so a host, of
// its fleet: one order, written once. It is pure: no I/O, no clock (callers
// pass now), no goroutines.
package placement

import (
	"cmp"
	"time"
)

// Rank says how soon a pool could serve a model, and at what cost to others;
// lower is better.
type Rank int

// The ranks, best first.
const (
	// Awake: the model is loaded and its gate is open: served now.
	Awake Rank = iota + 1
	// Loading: the model is being loaded, or is loaded behind a closed gate,
	// or requests for it already wait there: joining them costs nothing more.
	Loading
	// Asleep: the model sleeps there (sleep mode): a wake is cheaper than a
	// cold start.
	Asleep
	// Empty: no engine, nothing loading, nobody waiting: a load there
	// disturbs nobody.
	Empty
	// Idle: the loaded model has had no request in flight or waiting for the
	// idle grace: a load evicts it, the least recently used first.
	Idle
	// Queue: anything else: the request queues for a swap behind other work,
	// the shortest queue first.
	Queue
)

var rankNames = [...]string{Awake: "awake", Loading: "loading", Asleep: "asleep", Empty: "empty", Idle: "idle", Queue: "queue"}

func (r Rank) String() string {
	if r < Awake || r > Queue {
		return "none"
	}
	return rankNames[r]
}

// Pool is what the ranking reads of one pool, as seen for the model to
// place. The zero value is an empty pool.
type Pool struct {
	// Loaded is the model serving in the pool; "" when none.
	Loaded string
	// Target is the model being loaded; "" when none.
	Target string
	// Swapping is set while a load or an unload is under way.
	Swapping bool
	// GateClosed is set while the pool drains towards a swap: requests for
	// Loaded queue instead of being admitted.
	GateClosed bool
	// Queued reports that requests for the model to place wait in the pool.
	Queued bool
	// Asleep reports that the model to place sleeps in the pool.
	Asleep bool
	// InFlight counts the requests being served, Waiting those queued (for
	// any model).
	InFlight, Waiting int
	// LastUsed is when a request last started or ended in the pool.
	LastUsed time.Time
}

// Candidate is one pool's rank for a model, with what breaks ties within a
// rank.
type Candidate struct {
	Rank Rank
	// LastUsed orders Idle pools: the least recently used first.
	LastUsed time.Time
	// Load is in flight plus waiting: the lower the better, within a rank.
	Load int
}

// Of ranks p for model. idleGrace is how long after its last use a loaded
// model still counts as in demand (a closed-loop client's gap between
// requests); zero counts a pool idle as soon as nothing is in flight or
// waiting, whatever now is.
func Of(p Pool, model string, now time.Time, idleGrace time.Duration) Candidate {
	c := Candidate{LastUsed: p.LastUsed, Load: p.InFlight + p.Waiting}
	switch {
	case p.Loaded == model && !p.GateClosed && !p.Swapping:
		c.Rank = Awake
	case p.Loaded == model || p.Target == model || p.Queued:
		c.Rank = Loading
	case p.Asleep:
		c.Rank = Asleep
	case p.Swapping:
		c.Rank = Queue // loading another model, or unloading
	case p.Loaded == "" && p.Waiting == 0:
		c.Rank = Empty
	case c.Load == 0 && (idleGrace <= 0 || now.Sub(p.LastUsed) >= idleGrace):
		c.Rank = Idle
	default:
		c.Rank = Queue
	}
	return c
}

// Compare orders two candidates, the better first: by rank, Idle ones by
// last use (the least recently used first), then by load. It returns a
// negative number when a is better, positive when b is, 0 when they tie.
func Compare(a, b Candidate) int {
	if c := cmp.Compare(a.Rank, b.Rank); c != 0 {
		return c
	}
	if a.Rank == Idle {
		if c := a.LastUsed.Compare(b.LastUsed); c != 0 {
			return c
		}
	}
	return cmp.Compare(a.Load, b.Load)
}
