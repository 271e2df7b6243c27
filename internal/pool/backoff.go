package pool

import (
	"errors"
	"fmt"
	"time"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// Restart backoff defaults (Options.RestartBackoff and MaxRestartBackoff).
const (
	DefaultRestartBackoff    = time.Second
	DefaultMaxRestartBackoff = 5 * time.Minute
)

// firstRequestHold is the least wait after the second and later deaths in
// a row of a profile's engine at its first request, whatever the base: such
// an engine dies of every request it is given, and each start costs a
// whole load (about 45 s for vLLM), so a short hold would keep the pool
// loading. The wait doubles from it, up to the cap.
const firstRequestHold = time.Minute

// ErrBackoff marks a request refused because the pool is backing off restarts
// of a profile that keeps failing.
var ErrBackoff = errors.New("engine restarts are backing off")

// restartBackoff spaces out the starts of a profile whose engine keeps failing
// (a failed load, a crash soon after it became ready, or a death at its first
// request(s), before any succeeded). The first failure is retried at once; the
// n-th consecutive one waits base·2^(n-2), capped at max, where base is at
// least firstRequestHold when the last failure was a death at the first
// request. An engine of the
// profile that stays ready for max or longer ends the streak, unless it dies
// at its first request: an engine that sat idle, ready, then died of the
// first request it was given, served nothing. Another profile's engine does
// not end the streak.
//
// Failures are counted per profile definition: a reload that changes the
// profile gives it a fresh start, one that leaves it as it was (a new value,
// Equal) does not. The zero value needs base and max set. It is not safe for
// concurrent use (the pool's mutex guards it).
type restartBackoff struct {
	base, max time.Duration
	prof      *profile.Profile // the profile failing; nil when none
	failures  int              // consecutive failures of prof
	until     time.Time        // no start of prof before this
	last      failure          // prof's last failure
	healthy   time.Time        // when prof's current engine became ready; zero when none
}

// failure is one failure of a profile's engine.
type failure struct {
	err error
	// exit is how the engine ended: statusapi.ExitLoadFailed, ExitCrashed
	// or ExitFirstRequest.
	exit string
	// reason is what the engine said went wrong (noteReason); "" when
	// nothing it printed read as that.
	reason string
}

// ready records that an engine of prof became ready at now: only the
// failing profile's own engine may end its streak by lasting.
func (b *restartBackoff) ready(prof *profile.Profile, now time.Time) {
	b.healthy = time.Time{}
	if same(prof, b.prof) {
		b.healthy = now
	}
}

// failed records failure f of prof at now and returns the wait before its
// next start.
func (b *restartBackoff) failed(prof *profile.Profile, f failure, now time.Time) time.Duration {
	// An engine that died at its first request served nothing, however
	// long it was ready: its death never ends the streak.
	lasted := f.exit != statusapi.ExitFirstRequest && !b.healthy.IsZero() && now.Sub(b.healthy) >= b.max
	if !same(b.prof, prof) || lasted {
		b.failures = 0
	}
	b.prof, b.last, b.healthy = prof, f, time.Time{}
	b.failures++
	d := b.delay()
	b.until = now.Add(d)
	return d
}

// delay is the wait after the current streak of failures.
func (b *restartBackoff) delay() time.Duration {
	if b.failures <= 1 {
		return 0
	}
	d := b.base
	if b.last.exit == statusapi.ExitFirstRequest {
		d = max(d, firstRequestHold)
	}
	for i := 2; i < b.failures && d < b.max; i++ {
		d *= 2
	}
	return min(d, b.max)
}

// clear ends the streak, for an operator who fixed its cause: the
// profile's next start is at once, and its next failure the first of a new
// streak. It returns the id of the profile whose streak it ended, "" when
// there was none.
func (b *restartBackoff) clear() string {
	if b.failures == 0 {
		return ""
	}
	id := b.prof.ID
	b.prof, b.failures, b.until, b.last, b.healthy = nil, 0, time.Time{}, failure{}, time.Time{}
	return id
}

// status is the streak as /status shows it at now, cur being the profile's
// current definition (nil once removed): nil when there is none, when an
// engine of the profile is ready again, or when a reload changed it.
func (b *restartBackoff) status(cur *profile.Profile, now time.Time) *statusapi.Failing {
	if b.failures == 0 || !b.healthy.IsZero() || !same(cur, b.prof) {
		return nil
	}
	st := &statusapi.Failing{Profile: b.prof.ID, Failures: b.failures, Exit: b.last.exit, Reason: b.last.reason, LastError: b.last.err.Error()}
	if now.Before(b.until) {
		at := b.until
		st.RetryAt = &at
	}
	return st
}

// same reports whether a and b are one profile for the backoff: the same
// value, or, after a reload, the same definition.
func same(a, b *profile.Profile) bool { return a == b || a.Equal(b) }

// refusal returns the error for a request for prof at now while its restarts are
// backing off, or nil.
func (b *restartBackoff) refusal(prof *profile.Profile, now time.Time) error {
	if !now.Before(b.until) || !same(prof, b.prof) {
		return nil
	}
	left := b.until.Sub(now)
	return &QueueError{
		Err:        fmt.Errorf("%w after %d consecutive failures (next start in %s); last error: %w", ErrBackoff, b.failures, left.Round(time.Millisecond), b.last.err),
		RetryAfter: left,
	}
}
