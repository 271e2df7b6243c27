package pool

import (
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
)

func tenantWaiter(tenant string, weight int, background bool, arrived time.Time) *Waiter {
	return &Waiter{Profile: "A", Tenant: tenant, Weight: weight, Background: background, Arrived: arrived}
}

// ceilinged is A loaded since t0 with an admission ceiling of n.
func ceilinged(n int) *Scheduler {
	return loadedAt(Policy{MinResidency: time.Hour, IdleGrace: time.Second, MaxInFlight: map[string]int{"A": n},
		BackgroundAge: time.Minute}, "A", t0)
}

// Requests beyond the ceiling wait in the pool's queue and go in as leases
// end; a new arrival does not jump the ones waiting.
func TestCeilingQueuesBeyondIt(t *testing.T) {
	s := ceilinged(2)
	now := t0.Add(time.Second)
	mustArrive(t, s, tenantWaiter("a", 1, false, now), true)
	mustArrive(t, s, tenantWaiter("a", 1, false, now), true)
	third := tenantWaiter("a", 1, false, now)
	mustArrive(t, s, third, false)
	if s.InFlight() != 2 || s.QueueLen() != 1 {
		t.Fatalf("in flight %d, queued %d; want 2 and 1", s.InFlight(), s.QueueLen())
	}
	s.Release(now, KeepAlive{})
	// A fourth arrives while the third waits for the freed slot: it queues.
	fourth := tenantWaiter("a", 1, false, now)
	mustArrive(t, s, fourth, false)
	d := s.Next(now)
	if len(d.Admit) != 1 || d.Admit[0] != third || d.Load != "" {
		t.Fatalf("after a release: %+v; want the third admitted", d)
	}
	if s.InFlight() != 2 || s.QueueLen() != 1 {
		t.Fatalf("in flight %d, queued %d", s.InFlight(), s.QueueLen())
	}
}

// With both tenants backlogged, the slots go in proportion to their
// weights, first come first served within each.
func TestFairShareFollowsWeights(t *testing.T) {
	s := &Scheduler{Policy: Policy{MinResidency: time.Hour, IdleGrace: time.Second, MaxInFlight: map[string]int{"A": 1}}}
	s.Begin("A")
	now := t0
	for i := range 200 {
		mustArrive(t, s, &Waiter{Profile: "A", Tenant: "reserved", Weight: 10, Arrived: now.Add(time.Duration(i))}, false)
	}
	for i := range 40 {
		mustArrive(t, s, &Waiter{Profile: "A", Tenant: "shared", Weight: 1, Arrived: now.Add(time.Duration(i))}, false)
	}
	got := s.Ready("A", now)
	counts := map[string]int{}
	for range 110 {
		if len(got) != 1 {
			t.Fatalf("admitted %d at once under a ceiling of 1", len(got))
		}
		counts[got[0].Tenant]++
		s.Release(now, KeepAlive{})
		got = s.Next(now).Admit
	}
	if r, sh := counts["reserved"], counts["shared"]; r < 90 || r > 110 || sh < 9 || sh > 11 {
		t.Fatalf("of 110 slots: reserved %d, shared %d; want about 100 and 10", r, sh)
	}
	// Within a tenant, first come first served: the shared tenant's got
	// its first requests, in order.
	s2 := &Scheduler{Policy: Policy{MinResidency: time.Hour, MaxInFlight: map[string]int{"A": 1}}}
	s2.Begin("A")
	a1, a2 := &Waiter{Profile: "A", Tenant: "t", Arrived: t0}, &Waiter{Profile: "A", Tenant: "t", Arrived: t0.Add(time.Second)}
	mustArrive(t, s2, a1, false)
	mustArrive(t, s2, a2, false)
	if got := s2.Ready("A", t0); len(got) != 1 || got[0] != a1 {
		t.Fatalf("first come not first served: %v", got)
	}
}

// A background tenant is served only when no other waits, unless its
// request has waited BackgroundAge: never starved.
func TestBackgroundTenant(t *testing.T) {
	s := ceilinged(1)
	now := t0.Add(time.Second)
	mustArrive(t, s, tenantWaiter("busy", 1, false, now), true) // holds the slot
	bg := tenantWaiter("batch", 1, true, now)
	mustArrive(t, s, bg, false)
	fg := tenantWaiter("interactive", 1, false, now.Add(time.Millisecond))
	mustArrive(t, s, fg, false)
	s.Release(now, KeepAlive{})
	if d := s.Next(now); len(d.Admit) != 1 || d.Admit[0] != fg {
		t.Fatalf("the background request went before the other: %+v", d)
	}
	s.Release(now, KeepAlive{})
	if d := s.Next(now); len(d.Admit) != 1 || d.Admit[0] != bg {
		t.Fatalf("with no other waiting, the background request did not go: %+v", d)
	}
	// Aged past BackgroundAge, it counts as any other.
	s = ceilinged(1)
	mustArrive(t, s, tenantWaiter("busy", 1, false, now), true)
	old := tenantWaiter("batch", 1, true, now)
	mustArrive(t, s, old, false)
	later := now.Add(2 * time.Minute)
	mustArrive(t, s, tenantWaiter("interactive", 1, false, later), false)
	s.Release(later, KeepAlive{})
	if d := s.Next(later); len(d.Admit) != 1 || d.Admit[0] != old {
		t.Fatalf("an aged background request was passed over: %+v", d)
	}
}

// A caller's tier counts in the choice of the profile to load next: a
// waiter of weight 10 for C goes before an older one of weight 1 for B, as
// if it had one more priority level, and a background one after both.
func TestTierCountsInTheNextLoad(t *testing.T) {
	pol := Policy{PriorityAge: time.Minute}
	b, c, bg := &profile.Profile{ID: "B"}, &profile.Profile{ID: "C"}, &profile.Profile{ID: "D"}
	for _, tc := range []struct {
		name  string
		first *Waiter // arrives first
		then  *Waiter // 30 s later
		want  string
	}{
		{"reserved", Caller{Tenant: "s", Weight: 1}.waiter(b, nil), Caller{Tenant: "r", Weight: 10}.waiter(c, nil), "C"},
		{"shared", Caller{Tenant: "s", Weight: 1}.waiter(b, nil), Caller{Tenant: "t", Weight: 1}.waiter(c, nil), "B"},
		{"background", Caller{Tenant: "n", Weight: 1, Background: true}.waiter(bg, nil), Caller{Tenant: "s", Weight: 1}.waiter(b, nil), "B"},
	} {
		s := loadedAt(pol, "A", t0)
		tc.first.Arrived, tc.then.Arrived = t0, t0.Add(30*time.Second)
		mustArrive(t, s, tc.first, false)
		mustArrive(t, s, tc.then, false)
		if d := s.Next(t0.Add(31 * time.Second)); d.Load != tc.want {
			t.Errorf("%s: loads %q, want %q", tc.name, d.Load, tc.want)
		}
	}
}
