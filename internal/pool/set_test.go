package pool

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/poold/poold/internal/placement"
	"github.com/poold/poold/internal/profile"
)

// Placement tests: pools are built but never run, so no engine starts; each
// pool's scheduler state is set by hand under its mutex.

const placementConfig = `{
  "pools": [
    {"name": "a", "gpus": [0]},
    {"name": "b", "gpus": [1]},
    {"name": "c", "gpus": [2]}
  ],
  "defaults": {"minResidency": "1m", "maxQueue": 16},
  "profiles": [
    {"id": "p", "model": "org/p", "command": ["true", "{port}"]},
    {"id": "q", "model": "org/q", "command": ["true", "{port}"]},
    {"id": "r", "model": "org/r", "command": ["true", "{port}"]},
    {"id": "bc", "model": "org/bc", "pools": ["b", "c"], "command": ["true", "{port}"]}
  ]
}`

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func newTestSet(t *testing.T) (*Set, *profile.Config, *fakeClock) {
	t.Helper()
	cfg, err := profile.Parse([]byte(placementConfig))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	clock := &fakeClock{now: t0.Add(time.Hour)}
	s := NewSet(cfg, Options{Now: clock.Now})
	if len(s.Pools()) != 3 {
		t.Fatalf("%d pools, want 3", len(s.Pools()))
	}
	return s, cfg, clock
}

// with runs f on p's scheduler under p.mu.
func with(p *Pool, f func(s *Scheduler)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.sched)
}

// A poolState is a way to set up one pool, relative to the clock's now.
type poolState func(t *testing.T, s *Scheduler, now time.Time)

func empty() poolState { return func(*testing.T, *Scheduler, time.Time) {} }

// ready: profile loaded long ago (residency over), inFlight leases open, last
// used `used` ago, and waiters queued for each of queued.
func ready(profile string, inFlight int, used time.Duration, queued ...string) poolState {
	return func(t *testing.T, s *Scheduler, now time.Time) {
		t.Helper()
		s.Begin(profile)
		s.Ready(profile, now.Add(-time.Hour))
		for range inFlight {
			mustArrive(t, s, waiter(profile, 0, now.Add(-used)), true)
		}
		if inFlight == 0 && used > 0 {
			mustArrive(t, s, waiter(profile, 0, now.Add(-used)), true)
			s.Release(now.Add(-used), KeepAlive{})
		}
		for _, q := range queued {
			if _, err := s.Arrive(waiter(q, 0, now.Add(-time.Second))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// loading: a swap to profile is under way, with waiters for queued.
func loading(profile string, queued ...string) poolState {
	return func(t *testing.T, s *Scheduler, now time.Time) {
		t.Helper()
		s.Begin(profile)
		for _, q := range queued {
			mustArrive(t, s, waiter(q, 0, now.Add(-time.Second)), false)
		}
	}
}

// closed: profile loaded, one lease open, the gate closed for a waiter of other.
func closed(profile, other string) poolState {
	return func(t *testing.T, s *Scheduler, now time.Time) {
		t.Helper()
		ready(profile, 1, time.Second, other)(t, s, now)
		s.Next(now)
		if !s.Closing() {
			t.Fatal("setup: gate not closed")
		}
	}
}

func TestPlacement(t *testing.T) {
	for _, tc := range []struct {
		name    string
		profile string
		a, b, c poolState
		want    string
	}{
		{"ready beats loading and empty", "p", empty(), loading("p", "p"), ready("p", 3, time.Second), "c"},
		{"ready beats idle", "p", ready("q", 0, time.Hour), ready("p", 5, 0), empty(), "b"},
		{"loading beats empty", "p", empty(), loading("p"), empty(), "b"},
		{"loading beats idle", "p", ready("q", 0, time.Hour), empty(), loading("p", "p", "p"), "c"},
		{"closed gate counts as loading: beats empty", "p", empty(), closed("p", "q"), empty(), "b"},
		{"closed gate loses to ready", "p", closed("p", "q"), ready("p", 4, 0), empty(), "b"},
		{"queued behind another profile beats empty: no second copy", "p", empty(), ready("q", 1, 0, "p"), empty(), "b"},
		{"queued behind a load beats empty", "p", empty(), empty(), loading("q", "q", "p"), "c"},
		{"empty beats idle", "p", ready("q", 0, time.Hour), ready("r", 0, 2*time.Hour), empty(), "c"},
		{"empty beats busy", "p", ready("q", 1, 0), empty(), ready("r", 1, 0), "b"},
		{"idle: least recently used", "p", ready("q", 0, 10*time.Minute), ready("r", 0, time.Hour), ready("q", 0, 5*time.Minute), "b"},
		{"idle: least recently used (c)", "p", ready("q", 0, 10*time.Minute), ready("r", 0, time.Minute), ready("q", 0, 20*time.Minute), "c"},
		{"idle beats busy with a shorter queue", "p", ready("q", 2, 0), ready("r", 0, 2*time.Second), ready("q", 1, 0), "b"},
		{"used within the idle grace is not idle", "p", ready("q", 0, 10*time.Millisecond), ready("r", 0, 5*time.Second), ready("q", 1, 0), "b"},
		{"busy: shortest queue", "p", ready("q", 3, 0), ready("r", 1, 0, "q"), ready("q", 1, 0), "c"},
		{"busy: in flight and waiting both count", "p", ready("q", 1, 0, "r", "r"), ready("r", 2, 0), ready("q", 2, 0, "r"), "b"},
		{"busy: a loading pool with a queue", "p", loading("q", "q", "q"), ready("r", 1, 0), loading("r", "r", "r", "r"), "b"},
		{"ties go to the first pool", "p", empty(), empty(), empty(), "a"},
		{"idle ties go to the first pool", "p", ready("q", 0, time.Hour), ready("r", 0, time.Hour), empty(), "c"},
		{"only eligible pools", "bc", empty(), ready("q", 4, 0), ready("r", 2, 0), "c"},
		{"only eligible pools, ready elsewhere ignored", "bc", ready("bc", 0, 0), ready("q", 0, time.Hour), empty(), "c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, cfg, clock := newTestSet(t)
			for i, st := range []poolState{tc.a, tc.b, tc.c} {
				with(set.Pools()[i], func(s *Scheduler) { st(t, s, clock.now) })
			}
			prof := cfg.Lookup(tc.profile)
			got, _ := set.place(prof)
			if got == nil || got.Name() != tc.want {
				var ranks string
				for _, p := range set.Pools() {
					c := p.candidate(prof.ID)
					ranks += fmt.Sprintf(" %s:{rank %d load %d used %s}", p.Name(), c.Rank, c.Load, offset(c.LastUsed))
				}
				name := "<nil>"
				if got != nil {
					name = got.Name()
				}
				t.Errorf("place(%s) = %s, want %s;%s", tc.profile, name, tc.want, ranks)
			}
		})
	}
}

func TestCandidateRank(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state poolState
		rank  placement.Rank
		load  int
	}{
		{"empty", empty(), placement.Empty, 0},
		{"ready, gate open", ready("p", 2, 0), placement.Awake, 2},
		{"ready, others waiting in residency", func(t *testing.T, s *Scheduler, now time.Time) {
			s.Begin("p")
			s.Ready("p", now.Add(-time.Second))
			mustArrive(t, s, waiter("p", 0, now), true)
			mustArrive(t, s, waiter("q", 0, now), false)
		}, placement.Awake, 2},
		{"ready, residency over with others waiting", ready("p", 1, 0, "q"), placement.Loading, 2},
		{"ready, draining", closed("p", "q"), placement.Loading, 2},
		{"loading it", loading("p"), placement.Loading, 0},
		{"queued on it", loading("q", "p"), placement.Loading, 1},
		{"idle other", ready("q", 0, time.Minute), placement.Idle, 0},
		{"idle other, within grace", ready("q", 0, 10*time.Millisecond), placement.Queue, 0},
		{"busy other", ready("q", 2, 0, "r"), placement.Queue, 3},
		// The engine is gone; its last lease will end without it. The pool holds
		// nothing, so it is as good as empty: p loads once the lease ends.
		{"lost engine, lease open", func(t *testing.T, s *Scheduler, now time.Time) {
			ready("q", 1, 0)(t, s, now)
			s.Lost()
		}, placement.Empty, 1},
		// An unload under way whose client left: nothing is queued and nothing
		// loaded, but the engine is still stopping, so the pool is not empty.
		{"unloading", func(t *testing.T, s *Scheduler, now time.Time) {
			ready("q", 0, time.Minute)(t, s, now)
			s.Begin("")
		}, placement.Queue, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, _, clock := newTestSet(t)
			p := set.Pool("a")
			with(p, func(s *Scheduler) { tc.state(t, s, clock.now) })
			c := p.candidate("p")
			if c.Rank != tc.rank || c.Load != tc.load {
				t.Errorf("candidate = rank %d load %d, want rank %d load %d", c.Rank, c.Load, tc.rank, tc.load)
			}
		})
	}
}

// The gate closes with the fake clock: the same pool ranks ready, then loading.
func TestCandidateFollowsTheClock(t *testing.T) {
	set, _, clock := newTestSet(t)
	p := set.Pool("a")
	with(p, func(s *Scheduler) {
		s.Begin("p")
		s.Ready("p", clock.now)
		mustArrive(t, s, waiter("p", 0, clock.now), true)
		mustArrive(t, s, waiter("q", 0, clock.now), false)
	})
	if c := p.candidate("p"); c.Rank != placement.Awake {
		t.Fatalf("in residency: rank %d, want ready", c.Rank)
	}
	clock.now = clock.now.Add(time.Minute) // the configured minResidency
	if c := p.candidate("p"); c.Rank != placement.Loading {
		t.Fatalf("after residency: rank %d, want loading", c.Rank)
	}
}

func TestAcquirePinned(t *testing.T) {
	set, cfg, _ := newTestSet(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	bc := cfg.Lookup("bc")
	for _, pin := range []string{"a", "nope"} {
		l, err := set.Acquire(cancelled, bc, pin, Caller{}, nil)
		if !errors.Is(err, ErrNoPool) || l != nil {
			t.Errorf("Acquire(bc, pin %q) = %v, %v; want ErrNoPool", pin, l, err)
		}
	}
	for _, p := range set.Pools() {
		if n := p.sched.QueueLen(); n != 0 || len(p.kick) != 0 {
			t.Errorf("pool %s: queue %d, kicked %d after a refused pin", p.Name(), n, len(p.kick))
		}
	}

	// An eligible pin queues on that pool (empty pools hold no engine, so the
	// request cannot be admitted and the cancelled context ends it at once),
	// even though placement would pick another pool.
	with(set.Pool("c"), func(s *Scheduler) { ready("q", 5, 0)(t, s, set.Pool("c").opts.Now()) })
	l, err := set.Acquire(cancelled, bc, "c", Caller{}, nil)
	if !errors.Is(err, context.Canceled) || l != nil {
		t.Fatalf("Acquire(bc, pin c) = %v, %v; want context.Canceled", l, err)
	}
	if len(set.Pool("c").kick) != 1 || len(set.Pool("b").kick) != 0 {
		t.Errorf("kicks b %d c %d, want the pinned pool c woken", len(set.Pool("b").kick), len(set.Pool("c").kick))
	}
	with(set.Pool("c"), func(s *Scheduler) {
		if s.QueueLen() != 0 {
			t.Errorf("pool c queue %d after the client left, want 0", s.QueueLen())
		}
	})
}

// Unpinned, Acquire queues on the pool place chooses.
func TestAcquireUsesPlacement(t *testing.T) {
	set, cfg, clock := newTestSet(t)
	with(set.Pool("a"), func(s *Scheduler) { ready("q", 0, time.Hour)(t, s, clock.now) })
	with(set.Pool("b"), func(s *Scheduler) { ready("r", 1, 0, "p")(t, s, clock.now) })
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := set.Acquire(cancelled, cfg.Lookup("p"), "", Caller{}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: %v, want context.Canceled", err)
	}
	for _, p := range set.Pools() {
		want := 0
		if p.Name() == "b" {
			want = 1
		}
		if len(p.kick) != want {
			t.Errorf("pool %s kicked %d, want %d (p is already queued on b)", p.Name(), len(p.kick), want)
		}
	}
	with(set.Pool("b"), func(s *Scheduler) {
		if n, _ := s.Waiting(); n["p"] != 1 {
			t.Errorf("b waiting %v, want the original p waiter only", n)
		}
	})
}

// A released lease wakes the pool's loop only when the loop may act on it:
// not in the steady state, where it would be one goroutine hand-off per
// request for nothing, but when someone waits.
func TestReleaseWakesLoopOnlyWhenNeeded(t *testing.T) {
	set, _, clock := newTestSet(t)
	a, b := set.Pool("a"), set.Pool("b")
	with(a, func(s *Scheduler) { ready("q", 1, 0)(t, s, clock.now) })
	with(b, func(s *Scheduler) { ready("r", 1, 0, "p")(t, s, clock.now) })
	(&Lease{p: a}).Release()
	(&Lease{p: b}).Release()
	if len(a.kick) != 0 {
		t.Errorf("steady pool a kicked %d times by a release, want 0", len(a.kick))
	}
	if len(b.kick) != 1 {
		t.Errorf("pool b, with p waiting, kicked %d times by a release, want 1", len(b.kick))
	}
	with(a, func(s *Scheduler) {
		if n := s.InFlight(); n != 0 {
			t.Errorf("pool a in flight %d after the release, want 0", n)
		}
	})
}
