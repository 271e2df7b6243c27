package pool

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A request that may not cause a swap (a tenant's request pinned to a pool
// that it may not swap, where placement would not put it) is served by its
// profile loaded or loading there, and refused otherwise; it never has the
// pool load a profile, nor keeps one from leaving.

func noSwap(profile string, arrived time.Time) *Waiter {
	return &Waiter{Profile: profile, Arrived: arrived, NoSwap: true}
}

func TestNoSwapArrive(t *testing.T) {
	pol := Policy{MinResidency: 10 * time.Second}
	tests := []struct {
		name   string
		s      func(t *testing.T) *Scheduler
		admit  bool
		refuse bool
	}{
		{"empty pool", func(*testing.T) *Scheduler { return &Scheduler{Policy: pol} }, false, true},
		{"another loaded", func(*testing.T) *Scheduler { return loadedAt(pol, "a", t0) }, false, true},
		{"another loaded, idle", func(*testing.T) *Scheduler { return loadedAt(Policy{}, "a", t0) }, false, true},
		{"another loading", func(*testing.T) *Scheduler {
			s := &Scheduler{Policy: pol}
			s.Begin("a")
			return s
		}, false, true},
		{"being unloaded", func(*testing.T) *Scheduler {
			s := loadedAt(pol, "m", t0)
			s.Begin("")
			return s
		}, false, true},
		{"loaded, gate open", func(*testing.T) *Scheduler { return loadedAt(pol, "m", t0) }, true, false},
		{"loading it", func(*testing.T) *Scheduler {
			s := &Scheduler{Policy: pol}
			s.Begin("m")
			return s
		}, false, false},
		{"loaded behind a closed gate", func(t *testing.T) *Scheduler {
			s := loadedAt(pol, "m", t0)
			mustArrive(t, s, waiter("x", 0, at(11*time.Second)), false)
			return s
		}, false, false},
		{"loaded, its ceiling full", func(t *testing.T) *Scheduler {
			s := loadedAt(Policy{MaxInFlight: map[string]int{"m": 1}}, "m", t0)
			mustArrive(t, s, waiter("m", 0, at(time.Second)), true)
			return s
		}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.s(t)
			loaded, queued := s.Loaded(), s.QueueLen()
			ok, err := s.Arrive(noSwap("m", at(12*time.Second)))
			switch {
			case tt.refuse && !errors.Is(err, ErrNoSwap):
				t.Fatalf("Arrive: %v, %v; want ErrNoSwap", ok, err)
			case !tt.refuse && err != nil:
				t.Fatalf("Arrive: %v", err)
			case ok != tt.admit:
				t.Fatalf("admitted %v, want %v", ok, tt.admit)
			}
			if want := queued + btoi(!tt.admit && !tt.refuse); s.QueueLen() != want {
				t.Fatalf("queue %d, want %d", s.QueueLen(), want)
			}
			if d := s.Next(at(time.Minute)); d.Load == "m" || s.Loaded() != loaded && s.Loaded() == "m" {
				t.Fatalf("the request had the pool load its profile: %+v", d)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The pool loaded for others never loads m for a request that may not
// swap, however long it is idle: the other team's model stays.
func TestNoSwapNeverLoads(t *testing.T) {
	s := loadedAt(Policy{}, "a", t0)
	if _, err := s.Arrive(noSwap("m", at(time.Minute))); !errors.Is(err, ErrNoSwap) {
		t.Fatalf("Arrive: %v", err)
	}
	for _, now := range []time.Time{at(time.Minute), at(time.Hour)} {
		if d := s.Next(now); d.Load != "" || d.Unload || len(d.Admit) != 0 {
			t.Fatalf("Next at %s: %+v", offset(now), d)
		}
	}
	if s.Loaded() != "a" {
		t.Fatalf("loaded %q", s.Loaded())
	}
}

// Waiting behind a closed gate, it is served if the gate reopens, and
// refused, not swapped back for, when the pool swaps to another.
func TestNoSwapBehindAClosedGate(t *testing.T) {
	pol := Policy{MinResidency: 10 * time.Second}
	t.Run("the swap goes ahead", func(t *testing.T) {
		s := loadedAt(pol, "m", t0)
		x := waiter("x", 0, at(11*time.Second))
		mustArrive(t, s, x, false)
		ns := noSwap("m", at(12*time.Second))
		mustArrive(t, s, ns, false)
		checkDecision(t, "drained", s.Next(at(13*time.Second)), nil, "x", time.Time{})
		s.Begin("x")
		if got := s.Stranded(); !sameWaiters(got, []*Waiter{ns}) {
			t.Fatalf("Stranded = [%s]", profiles(got))
		}
		if got := s.Ready("x", at(20*time.Second)); !sameWaiters(got, []*Waiter{x}) {
			t.Fatalf("Ready admitted [%s]", profiles(got))
		}
		if s.QueueLen() != 0 {
			t.Fatalf("queue %d", s.QueueLen())
		}
		if d := s.Next(at(time.Hour)); d.Load != "" {
			t.Fatalf("swapped back: %+v", d)
		}
	})
	t.Run("the gate reopens", func(t *testing.T) {
		s := loadedAt(pol, "m", t0)
		x := waiter("x", 0, at(11*time.Second))
		mustArrive(t, s, x, false)
		ns := noSwap("m", at(12*time.Second))
		mustArrive(t, s, ns, false)
		s.Cancel(x)
		checkDecision(t, "reopened", s.Next(at(13*time.Second)), []*Waiter{ns}, "", time.Time{})
	})
	t.Run("older than the request that swaps", func(t *testing.T) {
		// A request for the loaded profile goes first, on it: no swap.
		s := loadedAt(pol, "m", t0)
		s.Policy.MaxInFlight = map[string]int{"m": 1}
		held := waiter("m", 0, at(time.Second))
		mustArrive(t, s, held, true)
		ns := noSwap("m", at(2*time.Second))
		mustArrive(t, s, ns, false)
		x := waiter("x", 0, at(11*time.Second))
		mustArrive(t, s, x, false)
		checkDecision(t, "draining", s.Next(at(12*time.Second)), nil, "", time.Time{})
		s.Release(at(13*time.Second), KeepAlive{})
		checkDecision(t, "drained", s.Next(at(13*time.Second)), []*Waiter{ns}, "", time.Time{})
	})
}

// Waiting for its profile being loaded, it is admitted with the others
// when it is ready, and answered with the failure when it fails.
func TestNoSwapWaitsForALoad(t *testing.T) {
	s := &Scheduler{}
	s.Begin("m")
	ns := noSwap("m", at(time.Second))
	mustArrive(t, s, ns, false)
	if got := s.Stranded(); len(got) != 0 {
		t.Fatalf("Stranded during its load: [%s]", profiles(got))
	}
	if got := s.Ready("m", at(2*time.Second)); !sameWaiters(got, []*Waiter{ns}) {
		t.Fatalf("Ready admitted [%s]", profiles(got))
	}

	s = &Scheduler{}
	s.Begin("m")
	ns = noSwap("m", at(time.Second))
	mustArrive(t, s, ns, false)
	if got := s.Failed("m"); !sameWaiters(got, []*Waiter{ns}) {
		t.Fatalf("Failed took [%s]", profiles(got))
	}
}

// When the engine is lost, a request that may not swap is not one that
// restarts it; one that may is.
func TestNoSwapAfterLost(t *testing.T) {
	pol := Policy{MaxInFlight: map[string]int{"m": 1}}
	for _, withOther := range []bool{false, true} {
		s := loadedAt(pol, "m", t0)
		mustArrive(t, s, waiter("m", 0, at(time.Second)), true)
		ns := noSwap("m", at(2*time.Second))
		mustArrive(t, s, ns, false)
		var w *Waiter
		if withOther {
			w = waiter("m", 0, at(3*time.Second))
			mustArrive(t, s, w, false)
		}
		s.Lost()
		s.Release(at(4*time.Second), KeepAlive{})
		if !withOther {
			if d := s.Next(at(5 * time.Second)); d.Load != "" {
				t.Fatalf("before Stranded: loaded for it: %+v", d)
			}
		}
		if got := s.Stranded(); !sameWaiters(got, []*Waiter{ns}) {
			t.Fatalf("Stranded = [%s]", profiles(got))
		}
		want := ""
		if withOther {
			want = "m"
		}
		checkDecision(t, "after Stranded", s.Next(at(5*time.Second)), nil, want, time.Time{})
	}
}

// A pinned request of a caller that may not swap the pinned pool may cause
// a swap there only where placement would put it unpinned (the pinned pool
// ranks with the best); elsewhere it waits for its profile loaded or
// loading there, or is refused with ErrNoSwap, and the pool's model stays.
func TestAcquirePinnedNoSwap(t *testing.T) {
	deny := func(string) bool { return false }
	allow := func(pool string) bool { return pool == "a" }
	for _, tc := range []struct {
		name    string
		a, b, c poolState
		pin     string
		mayswap func(string) bool
		refused bool
	}{
		{"loaded elsewhere: refused", ready("q", 0, time.Hour), ready("p", 1, 0), ready("r", 1, 0), "a", deny, true},
		{"loaded elsewhere, the pool allowed", ready("q", 0, time.Hour), ready("p", 1, 0), ready("r", 1, 0), "a", allow, false},
		{"loaded elsewhere, no tenant", ready("q", 0, time.Hour), ready("p", 1, 0), ready("r", 1, 0), "a", nil, false},
		{"loading elsewhere: refused", empty(), loading("p"), empty(), "a", deny, true},
		{"empty elsewhere: refused", ready("q", 1, 0), empty(), ready("r", 1, 0), "a", deny, true},
		{"where placement puts it", ready("q", 0, time.Hour), ready("r", 1, 0), ready("r", 1, 0), "a", deny, false},
		{"tied with placement's choice", empty(), empty(), empty(), "b", deny, false},
		{"loading there, loaded elsewhere", loading("p"), ready("p", 1, 0), empty(), "a", deny, false},
		{"loaded there behind a closed gate, awake elsewhere", closed("p", "q"), ready("p", 1, 0), empty(), "a", deny, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, cfg, clock := newTestSet(t)
			for i, st := range []poolState{tc.a, tc.b, tc.c} {
				with(set.Pools()[i], func(s *Scheduler) { st(t, s, clock.now) })
			}
			pinned := set.Pool(tc.pin)
			var loaded string
			var queued int
			with(pinned, func(s *Scheduler) { loaded, queued = s.Loaded(), s.QueueLen() })
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := set.Acquire(cancelled, cfg.Lookup("p"), tc.pin, Caller{Tenant: "t", MaySwap: tc.mayswap}, nil)
			if tc.refused && !errors.Is(err, ErrNoSwap) || !tc.refused && !errors.Is(err, context.Canceled) {
				t.Fatalf("Acquire: %v, want refused %v", err, tc.refused)
			}
			with(pinned, func(s *Scheduler) {
				if s.Loaded() != loaded || s.QueueLen() != queued {
					t.Errorf("pool %s: loaded %q queue %d, was %q and %d", tc.pin, s.Loaded(), s.QueueLen(), loaded, queued)
				}
			})
			if tc.refused && len(pinned.kick) != 0 {
				t.Errorf("pool %s woken by a refused request", tc.pin)
			}
		})
	}
}
