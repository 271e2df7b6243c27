package proxy

import (
	"runtime/debug"
	"sync/atomic"
	"time"
)

// DefaultQueueBodyBytes is the default bound on the request bodies that the
// requests waiting for a lease hold together.
const DefaultQueueBodyBytes = 256 << 20

// Returning memory to the OS: once bodies of freeAfter bytes or more have
// come in since the last return, and no request holds one any more, the
// memory is returned freeDelay later (when the last handler has returned and
// its body is garbage), at most once per freeEvery.
const (
	freeAfter = 64 << 20
	freeDelay = time.Second
	freeEvery = 10 * time.Second
)

// bodyBudget accounts for the request bodies poold holds. The bodies of
// requests that wait for a lease are bounded together, host-wide: past the
// bound a request that would wait is refused (503) instead of holding its
// body in memory for as long as it waits. And once a burst of large bodies is
// over, their memory is returned to the OS rather than kept as a peak-sized
// heap. The zero value has no bound.
type bodyBudget struct {
	max      int64        // bound on waiting bodies; zero or negative: none
	waiting  atomic.Int64 // bytes of the bodies of requests waiting now
	live     atomic.Int64 // bytes of the bodies of every request under way
	received atomic.Int64 // bytes of bodies come in since memory was last returned
	lastFree atomic.Int64 // unix nanoseconds of the last return; 0: none
	freeing  atomic.Bool  // a return of memory to the OS is scheduled
}

// request accounts for a request whose body is n bytes, from now until done
// is called, when the request is over. hold is its Waiter.Hold: it reserves
// n bytes of the waiting bound, or refuses; unqueue gives them back once the
// request no longer waits (a no-op if hold never reserved).
func (b *bodyBudget) request(n int64) (hold func() bool, unqueue, done func()) {
	b.live.Add(n)
	b.received.Add(n)
	reserved := false
	hold = func() bool {
		for {
			cur := b.waiting.Load()
			if b.max > 0 && cur+n > b.max {
				return false
			}
			if b.waiting.CompareAndSwap(cur, cur+n) {
				reserved = true
				return true
			}
		}
	}
	unqueue = func() {
		if reserved {
			reserved = false
			b.waiting.Add(-n)
		}
	}
	done = func() {
		unqueue()
		if b.live.Add(-n) == 0 && b.received.Load() >= freeAfter &&
			time.Since(time.Unix(0, b.lastFree.Load())) >= freeEvery && b.freeing.CompareAndSwap(false, true) {
			time.AfterFunc(freeDelay, b.free)
		}
	}
	return hold, unqueue, done
}

// free returns the heap's unused memory to the OS.
func (b *bodyBudget) free() {
	b.received.Store(0)
	b.lastFree.Store(time.Now().UnixNano())
	debug.FreeOSMemory()
	b.freeing.Store(false)
}
