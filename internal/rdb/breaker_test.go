package rdb

import (
	"testing"
	"time"
)

// The breaker on a fake clock: three failures in a row open it for the
// backoff, during which nothing is allowed; then one probe at a time, whose
// failure doubles the backoff (up to the cap) and whose success closes it;
// a success in between resets the count.
func TestBreaker(t *testing.T) {
	now := time.Unix(1000, 0)
	b := &Breaker{After: 3, Backoff: 5 * time.Second, MaxBackoff: 12 * time.Second}
	fail := func(want BreakerState, wantChanged bool) {
		t.Helper()
		if !b.Allow(now) {
			t.Fatalf("at %v: not allowed", now)
		}
		if s, changed, _ := b.Record(now, false); s != want || changed != wantChanged {
			t.Fatalf("at %v: a failure left %v (changed %v), want %v (%v)", now, s, changed, want, wantChanged)
		}
	}
	fail(BreakerClosed, false)
	fail(BreakerClosed, false)
	if !b.Allow(now) {
		t.Fatal("closed breaker refused")
	}
	b.Record(now, true) // a success: the count starts again
	fail(BreakerClosed, false)
	fail(BreakerClosed, false)
	if !b.Allow(now) {
		t.Fatal("closed breaker refused")
	}
	if s, changed, backoff := b.Record(now, false); s != BreakerOpen || !changed || backoff != 5*time.Second {
		t.Fatalf("the third failure in a row: %v %v %v, want open for 5s", s, changed, backoff)
	}
	for _, d := range []time.Duration{0, time.Second, 4999 * time.Millisecond} {
		if b.Allow(now.Add(d)) {
			t.Fatalf("open breaker allowed a call %v into its backoff", d)
		}
	}
	// Half-open: one probe, the others refused while it is in flight.
	now = now.Add(5 * time.Second)
	if !b.Allow(now) || b.Allow(now) || b.Allow(now) {
		t.Fatal("half-open: want exactly one probe allowed")
	}
	if s, _, backoff := b.Record(now, false); s != BreakerOpen || backoff != 10*time.Second {
		t.Fatalf("a failed probe: %v for %v, want open for 10s", s, backoff)
	}
	if b.Allow(now.Add(9 * time.Second)) {
		t.Fatal("allowed within the doubled backoff")
	}
	now = now.Add(10 * time.Second)
	if !b.Allow(now) {
		t.Fatal("no probe after the doubled backoff")
	}
	if _, _, backoff := b.Record(now, false); backoff != 12*time.Second {
		t.Fatalf("backoff %v, want the cap, 12s", backoff)
	}
	now = now.Add(12 * time.Second)
	if !b.Allow(now) {
		t.Fatal("no probe after the capped backoff")
	}
	if s, changed, _ := b.Record(now, true); s != BreakerClosed || !changed {
		t.Fatalf("a probe that succeeded: %v %v, want closed", s, changed)
	}
	if first, second := b.Allow(now), b.Allow(now); !first || !second {
		t.Fatal("closed again: every call allowed")
	}
	b.Record(now, false)
	b.Record(now, false)
	if s, _, backoff := b.Record(now, false); s != BreakerOpen || backoff != 5*time.Second {
		t.Fatalf("after closing, the backoff starts again at 5s: %v %v", s, backoff)
	}

	var zero Breaker // the defaults
	for range DefaultBreakerAfter - 1 {
		zero.Allow(now)
		zero.Record(now, false)
	}
	zero.Allow(now)
	if s, _, backoff := zero.Record(now, false); s != BreakerOpen || backoff != DefaultBreakerBackoff {
		t.Fatalf("the zero breaker: %v for %v", s, backoff)
	}
}
