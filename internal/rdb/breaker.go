package rdb

import (
	"sync"
	"time"
)

// Defaults for Breaker's zero values.
const (
	DefaultBreakerAfter      = 3
	DefaultBreakerBackoff    = 5 * time.Second
	DefaultBreakerMaxBackoff = 30 * time.Second
)

// BreakerState is where a Breaker stands.
type BreakerState int

const (
	// BreakerClosed: calls go to Redis.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls are refused at once, without asking Redis, until the
	// backoff ends.
	BreakerOpen
	// BreakerHalfOpen: the backoff is over; one call at a time probes Redis, the
	// others are refused as while open.
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "closed"
}

// Breaker is a circuit breaker on the clock it is given: After failures in
// a row open it for Backoff, during which Allow refuses every call; then
// one call at a time probes, and its success closes the breaker while its
// failure opens it again for twice as long, up to MaxBackoff (any call that
// Redis answered closes it, as a late one while open). It is pure
// policy: the caller says when and how each call ended. Zero values: After
// → DefaultBreakerAfter, Backoff → DefaultBreakerBackoff, MaxBackoff →
// DefaultBreakerMaxBackoff; the zero Breaker is closed and ready. It is
// safe for concurrent use.
type Breaker struct {
	After               int
	Backoff, MaxBackoff time.Duration

	mu      sync.Mutex // guards the fields below
	state   BreakerState
	fails   int           // failures in a row while closed
	backoff time.Duration // of the last opening; zero: never opened since closed
	until   time.Time     // the end of the opening
	probing bool          // a probe is in flight (half-open)
}

// Allow reports whether a call may go to Redis at now; every call allowed
// must be followed by Record.
func (b *Breaker) Allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerOpen:
		if now.Before(b.until) {
			return false
		}
		b.state = BreakerHalfOpen
		fallthrough
	case BreakerHalfOpen:
		if b.probing {
			return false
		}
		b.probing = true
	}
	return true
}

// Record folds in how an allowed call ended at now (ok: Redis answered),
// and returns the state after it, whether it changed, and for an opening
// how long it lasts.
func (b *Breaker) Record(now time.Time, ok bool) (state BreakerState, changed bool, backoff time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.state
	switch {
	case ok:
		b.state, b.fails, b.backoff, b.probing = BreakerClosed, 0, 0, false
	case b.state == BreakerHalfOpen:
		b.probing = false
		b.open(now, min(2*b.backoff, cmpOr(b.MaxBackoff, DefaultBreakerMaxBackoff)))
	case b.state == BreakerClosed:
		if b.fails++; b.fails >= cmpInt(b.After, DefaultBreakerAfter) {
			b.open(now, min(cmpOr(b.Backoff, DefaultBreakerBackoff), cmpOr(b.MaxBackoff, DefaultBreakerMaxBackoff)))
		}
	}
	if b.state == BreakerOpen {
		backoff = b.backoff
	}
	return b.state, b.state != was, backoff
}

// open opens the breaker at now for d; b.mu is held.
func (b *Breaker) open(now time.Time, d time.Duration) {
	b.state, b.fails, b.backoff, b.until = BreakerOpen, 0, d, now.Add(d)
}

func cmpInt(n, dflt int) int {
	if n > 0 {
		return n
	}
	return dflt
}
