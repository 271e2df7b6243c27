package pool

import (
	"testing"
	"time"
)

// learned is the pool's policy: a grace learned from each profile's gaps,
// no less than 20 ms and no more than the residency.
func learned(residency time.Duration) Policy {
	return Policy{MinResidency: residency, IdleGrace: DefaultGraceFloor, LearnGrace: true, PriorityAge: time.Minute}
}

// A closed-loop client with 2 s of think time teaches its profile a grace
// that bridges its gaps: against a competing queue it keeps its model for
// the residency, then the gate closes for the competitor.
func TestLearnedGraceKeepsAThinkingClient(t *testing.T) {
	s := loadedAt(learned(30*time.Second), "A", t0)
	now := t0
	request := func() {
		t.Helper()
		mustArrive(t, s, waiter("A", 0, now), true)
		now = now.Add(100 * time.Millisecond) // the answer
		s.Release(now, KeepAlive{})
		now = now.Add(2 * time.Second) // think
	}
	request()
	request()
	if g := s.IdleGrace(); g < 3*time.Second || g > 5*time.Second {
		t.Fatalf("grace after two 2 s gaps: %s, want about 4 s", g)
	}
	// A competitor queues; the thinking client keeps A until the residency
	// ends (t0+30s), each of its requests admitted at once.
	mustArrive(t, s, waiter("B", 0, now), false)
	for now.Before(t0.Add(29 * time.Second)) {
		if d := s.Next(now); d.Load != "" || s.Closing() {
			t.Fatalf("at t0+%s the gate closed for B while A's client thinks", now.Sub(t0))
		}
		request()
	}
	// Past the residency, the gate closes and B goes next.
	now = t0.Add(31 * time.Second)
	if d := s.Next(now); !s.Closing() || d.Load != "B" {
		t.Fatalf("past the residency: closing %v, load %q; want B next", s.Closing(), d.Load)
	}
}

// A lone client that alternates models teaches nothing (its profile is
// swapped out before its next request): the grace stays at the floor, and
// the next profile loads within it, not after a second.
func TestLearnedGraceLetsALoneClientSwapAtOnce(t *testing.T) {
	s := loadedAt(learned(30*time.Second), "A", t0)
	mustArrive(t, s, waiter("A", 0, t0), true)
	s.Release(t0.Add(100*time.Millisecond), KeepAlive{})
	now := t0.Add(101 * time.Millisecond) // the client asks for B at once
	mustArrive(t, s, waiter("B", 0, now), false)
	d := s.Next(now)
	if d.Load != "" || d.Recheck.Sub(now) > DefaultGraceFloor {
		t.Fatalf("right after A's answer: %+v; want a recheck within %s", d, DefaultGraceFloor)
	}
	if d := s.Next(d.Recheck); d.Load != "B" {
		t.Fatalf("at the recheck: %+v; want B loaded", d)
	}
}

// The learned grace stays between the floor and the residency.
func TestLearnedGraceBounds(t *testing.T) {
	s := loadedAt(learned(5*time.Second), "A", t0)
	now := t0
	for range 10 { // gaps of a minute: clamped to the 5 s residency
		mustArrive(t, s, waiter("A", 0, now), true)
		s.Release(now, KeepAlive{})
		now = now.Add(time.Minute)
	}
	if g := s.IdleGrace(); g != 5*time.Second {
		t.Fatalf("grace %s, want the 5 s residency", g)
	}
	fast := loadedAt(learned(time.Minute), "A", t0)
	now = t0
	for range 10 { // back-to-back requests: no gap at all
		mustArrive(t, fast, waiter("A", 0, now), true)
		fast.Release(now, KeepAlive{})
	}
	if g := fast.IdleGrace(); g != DefaultGraceFloor {
		t.Fatalf("grace %s, want the %s floor", g, DefaultGraceFloor)
	}
	fixed := loadedAt(Policy{MinResidency: time.Minute, IdleGrace: time.Second}, "A", t0)
	mustArrive(t, fixed, waiter("A", 0, t0), true)
	fixed.Release(t0, KeepAlive{})
	mustArrive(t, fixed, waiter("A", 0, t0.Add(10*time.Second)), true)
	if g := fixed.IdleGrace(); g != time.Second {
		t.Fatalf("a fixed grace became %s", g)
	}
}
