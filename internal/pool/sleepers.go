package pool

import (
	"slices"
	"sync/atomic"
	"time"
)

// Which sleepers to keep and which to evict: pure decisions over a pool's
// sleeping engines, made under the pool's mutex and carried out by sleep.go.

// sleeper is an engine put to sleep: its process and port stay, its weights
// are in host RAM (level 1) or dropped (level 2), and it waits to be woken or
// evicted. Its fields do not change once it is in the pool's list.
type sleeper struct {
	eng       *engine
	level     int
	since     time.Time     // when it fell asleep: the least recently used goes first
	hostBytes int64         // host RAM it holds, counted against the host's budget
	gone      chan struct{} // closed when it leaves the list (woken or stopped)
	// self is set for an engine that fell asleep by itself while it served
	// (selfsleep.go), not put to sleep by the pool: it is kept though its
	// profile does not enable sleep.
	self bool
}

// hostSleep counts the host RAM that the sleepers of every pool of a Set hold.
type hostSleep struct{ held atomic.Int64 }

// reserve counts n more bytes held if that stays within limit (zero: none).
func (h *hostSleep) reserve(n, limit int64) bool {
	for {
		cur := h.held.Load()
		if limit > 0 && cur+n > limit {
			return false
		}
		if h.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

func (h *hostSleep) release(n int64) { h.held.Add(-n) }

// byAge returns list ordered by how long each has been asleep, the longest
// first: the order in which sleepers are evicted.
func byAge(list []*sleeper) []*sleeper {
	return slices.SortedStableFunc(slices.Values(list), func(a, b *sleeper) int { return a.since.Compare(b.since) })
}

// sleepRoom decides which of a pool's sleepers to evict so that one more
// engine, holding need bytes of host RAM, may sleep beside them. Afterwards
// the pool keeps fewer than maxSleeping sleepers, and the host's sleepers
// together (held bytes now, plus need, less what the evicted hold) stay
// within budget (zero: no bound). The longest asleep go first, and no more
// than must. fits is false when there is no room even with every sleeper of
// the pool evicted, or when maxSleeping is zero: the newcomer is then
// stopped instead, and no sleeper is evicted for it.
func sleepRoom(list []*sleeper, maxSleeping int, need, budget, held int64) (evict []*sleeper, fits bool) {
	if maxSleeping <= 0 {
		return nil, false
	}
	order := byAge(list)
	freed := int64(0)
	for n := range len(order) + 1 {
		if n > 0 {
			freed += order[n-1].hostBytes
		}
		if n < len(order)-maxSleeping+1 {
			continue // still too many for maxSleeping
		}
		if budget <= 0 || held-freed+need <= budget {
			return order[:n], true
		}
	}
	return nil, false
}
