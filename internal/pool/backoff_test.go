package pool

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// crash is the failure of an engine that died with err while serving.
func crash(err error) failure { return failure{err: err, exit: statusapi.ExitCrashed} }

func TestRestartBackoffGrowsToCap(t *testing.T) {
	b := restartBackoff{base: 100 * time.Millisecond, max: 500 * time.Millisecond}
	a := &profile.Profile{ID: "a"}
	boom := errors.New("boom")
	now := t0
	want := []time.Duration{0, 100, 200, 400, 500, 500}
	for i, w := range want {
		b.ready(a, now) // each engine dies 10ms after it became ready
		now = now.Add(10 * time.Millisecond)
		if got := b.failed(a, crash(boom), now); got != w*time.Millisecond {
			t.Fatalf("failure %d: delay %s, want %s", i+1, got, w*time.Millisecond)
		}
	}
	err := b.refusal(a, now.Add(499*time.Millisecond))
	var qe *QueueError
	if !errors.As(err, &qe) || !errors.Is(err, ErrBackoff) || !errors.Is(err, boom) || qe.RetryAfter != time.Millisecond {
		t.Fatalf("refusal during backoff: %v", err)
	}
	if !strings.Contains(err.Error(), "after 6 consecutive failures") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("refusal message: %v", err)
	}
	if err := b.refusal(a, now.Add(500*time.Millisecond)); err != nil {
		t.Fatalf("refusal after the backoff: %v", err)
	}
	// A reload gives every profile a new value: one that changed is not
	// refused, one left as it was still is, and its streak goes on.
	changed := &profile.Profile{ID: "a", Args: []string{"--enforce-eager"}}
	if err := b.refusal(changed, now); err != nil {
		t.Fatalf("a changed profile is refused: %v", err)
	}
	same := &profile.Profile{ID: "a"}
	if err := b.refusal(same, now); err == nil {
		t.Fatal("a profile that a reload left as it was is not refused")
	}
	if d := b.failed(same, crash(boom), now.Add(time.Second)); d != 500*time.Millisecond {
		t.Fatalf("the next failure of the profile reloaded unchanged waits %s, want the cap", d)
	}
}

func TestRestartBackoffResetByLastingEngine(t *testing.T) {
	b := restartBackoff{base: time.Second, max: time.Minute}
	a := &profile.Profile{ID: "a"}
	now := t0
	for range 3 {
		b.failed(a, failure{err: errors.New("load failed"), exit: statusapi.ExitLoadFailed}, now)
	}
	b.ready(a, now)
	now = now.Add(time.Minute) // served a full cap's worth
	if d := b.failed(a, crash(errors.New("crash")), now); d != 0 {
		t.Fatalf("a crash after a lasting run waits %s, want 0", d)
	}
	if d := b.failed(a, crash(errors.New("crash")), now); d != time.Second {
		t.Fatalf("the next consecutive failure waits %s, want 1s", d)
	}
	// Another profile's failure starts its own streak.
	if d := b.failed(&profile.Profile{ID: "b"}, crash(errors.New("x")), now); d != 0 {
		t.Fatalf("first failure of another profile waits %s", d)
	}
}

// Only the failing profile's own engine ends its streak by lasting: the
// engine of another profile, ready on the pool meanwhile, does not.
func TestRestartBackoffNotResetByAnotherProfile(t *testing.T) {
	b := restartBackoff{base: time.Second, max: time.Minute}
	a, other := &profile.Profile{ID: "a"}, &profile.Profile{ID: "b"}
	now := t0
	b.failed(a, failure{err: errors.New("load failed"), exit: statusapi.ExitLoadFailed}, now)
	b.failed(a, failure{err: errors.New("load failed"), exit: statusapi.ExitLoadFailed}, now)
	b.ready(other, now) // the pool serves b for longer than the cap
	now = now.Add(time.Hour)
	if d := b.failed(a, failure{err: errors.New("load failed"), exit: statusapi.ExitLoadFailed}, now); d != 2*time.Second {
		t.Fatalf("the third failure in a row, after another profile lasted, waits %s, want 2s", d)
	}
}

// An engine that died at its first request(s), before any succeeded on it,
// served nothing: however long it was ready, idle, before the first request
// came, its death goes on the streak. One that answered requests and
// lasted ends the streak, as before.
// Deaths at the first request add up however long each engine was ready,
// and hold the profile for at least firstRequestHold from the second on,
// whatever the base: each start is a whole load, and the engine dies of
// every request it is given.
func TestRestartBackoffFirstRequestDeathsAddUp(t *testing.T) {
	b := restartBackoff{base: time.Second, max: 5 * time.Minute}
	a := &profile.Profile{ID: "a"}
	first := failure{err: errors.New(`engine "a" died at its first request`), exit: statusapi.ExitFirstRequest, reason: "RuntimeError: x"}
	now := t0
	for i, want := range []time.Duration{0, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute} {
		b.ready(a, now)
		now = now.Add(time.Hour) // ready, idle, for longer than the cap
		if d := b.failed(a, first, now); d != want {
			t.Fatalf("death %d at the first request: wait %s, want %s", i+1, d, want)
		}
	}
	b.ready(a, now)
	now = now.Add(5 * time.Minute)
	if d := b.failed(a, crash(errors.New("crash")), now); d != 0 {
		t.Fatalf("a crash after a lasting run waits %s, want 0", d)
	}
}

// The streak as /status shows it: from the first failure, with the next
// start's time only while there is a wait, until an engine of the profile
// is ready again or the profile changed.
func TestRestartBackoffStatus(t *testing.T) {
	b := restartBackoff{base: time.Second, max: time.Minute}
	a := &profile.Profile{ID: "a"}
	if st := b.status(a, t0); st != nil {
		t.Fatalf("status before any failure: %+v", st)
	}
	first := failure{err: errors.New(`engine "a" died at its first request`), exit: statusapi.ExitFirstRequest, reason: "RuntimeError: x"}
	b.failed(a, first, t0)
	want := statusapi.Failing{Profile: "a", Failures: 1, Exit: statusapi.ExitFirstRequest, Reason: "RuntimeError: x", LastError: first.err.Error()}
	if st := b.status(a, t0); st == nil || *st != want {
		t.Fatalf("after one failure: %+v, want %+v", st, want)
	}
	b.failed(a, first, t0)
	st := b.status(a, t0)
	if st == nil || st.Failures != 2 || st.RetryAt == nil || !st.RetryAt.Equal(t0.Add(firstRequestHold)) {
		t.Fatalf("after two failures: %+v, want a retry at %s", st, t0.Add(firstRequestHold))
	}
	if st := b.status(a, t0.Add(firstRequestHold)); st == nil || st.RetryAt != nil {
		t.Fatalf("once the wait ran out: %+v, want failing with no retry time", st)
	}
	if st := b.status(&profile.Profile{ID: "a"}, t0); st == nil {
		t.Fatal("a reload that left the profile as it was hides its streak")
	}
	if st := b.status(&profile.Profile{ID: "a", Args: []string{"--enforce-eager"}}, t0); st != nil {
		t.Fatalf("a changed profile shows the old one's streak: %+v", st)
	}
	if st := b.status(nil, t0); st != nil {
		t.Fatalf("a removed profile shows its streak: %+v", st)
	}
	b.ready(a, t0.Add(time.Second))
	if st := b.status(a, t0.Add(time.Second)); st != nil {
		t.Fatalf("once an engine of it is ready again: %+v", st)
	}
}

// Clearing the streak (an operator's) lets the profile start at once, and
// its next failure is the first again.
func TestRestartBackoffClear(t *testing.T) {
	b := restartBackoff{base: time.Second, max: time.Minute}
	a := &profile.Profile{ID: "a"}
	if id := b.clear(); id != "" {
		t.Fatalf("clearing no streak cleared %q", id)
	}
	for range 3 {
		b.failed(a, crash(errors.New("crash")), t0)
	}
	if id := b.clear(); id != "a" {
		t.Fatalf("clear: %q, want a", id)
	}
	if err := b.refusal(a, t0); err != nil || b.status(a, t0) != nil {
		t.Fatalf("after the clear: refusal %v, status %+v", err, b.status(a, t0))
	}
	if d := b.failed(a, crash(errors.New("crash")), t0); d != 0 {
		t.Fatalf("the first failure after the clear waits %s, want 0", d)
	}
}
