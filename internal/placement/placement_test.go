package placement

import (
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestOf(t *testing.T) {
	const grace = time.Second
	old := t0.Add(-time.Minute)
	recent := t0.Add(-grace / 2)
	tests := []struct {
		name string
		p    Pool
		want Rank
	}{
		{"loaded, gate open", Pool{Loaded: "m", InFlight: 3, LastUsed: recent}, Awake},
		{"loaded, gate open, with waiters for it", Pool{Loaded: "m", Waiting: 2, Queued: true}, Awake},
		{"loaded behind a closed gate", Pool{Loaded: "m", GateClosed: true, Waiting: 1}, Loading},
		{"loading it", Pool{Target: "m", Swapping: true}, Loading},
		{"queued for it behind another", Pool{Loaded: "x", Queued: true, Waiting: 1, InFlight: 4}, Loading},
		{"asleep there, another loaded and busy", Pool{Loaded: "x", InFlight: 2, Asleep: true}, Asleep},
		{"asleep there, pool empty", Pool{Asleep: true}, Asleep},
		{"loading another", Pool{Target: "x", Swapping: true}, Queue},
		{"unloading", Pool{Swapping: true}, Queue},
		{"empty", Pool{}, Empty},
		{"empty after a failure, used before", Pool{LastUsed: recent}, Empty},
		{"no engine but waiters for another", Pool{Waiting: 1}, Queue},
		{"another loaded, idle past the grace", Pool{Loaded: "x", LastUsed: old}, Idle},
		{"another loaded, used within the grace", Pool{Loaded: "x", LastUsed: recent}, Queue},
		{"another loaded, in flight", Pool{Loaded: "x", InFlight: 1, LastUsed: old}, Queue},
		{"another loaded, draining with nothing left", Pool{Loaded: "x", GateClosed: true, LastUsed: old}, Idle},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Of(tt.p, "m", t0, grace)
			if c.Rank != tt.want {
				t.Fatalf("rank %s, want %s", c.Rank, tt.want)
			}
			if c.Load != tt.p.InFlight+tt.p.Waiting || !c.LastUsed.Equal(tt.p.LastUsed) {
				t.Fatalf("candidate %+v does not carry the pool's load and last use", c)
			}
		})
	}
}

// With no idle grace a loaded pool with nothing in flight or waiting is idle
// at once (fleetd, which does not know a host's grace).
func TestOfNoGrace(t *testing.T) {
	for _, now := range []time.Time{t0, {}, t0.Add(-time.Hour)} {
		if c := Of(Pool{Loaded: "x", LastUsed: t0}, "m", now, 0); c.Rank != Idle {
			t.Fatalf("now %v: rank %s, want idle", now, c.Rank)
		}
	}
}

// The order, best first: awake, loading, asleep, empty, idle (least recently
// used first), queue (shortest first); ties within a rank by load.
func TestCompare(t *testing.T) {
	want := []Candidate{
		{Rank: Awake, Load: 0},
		{Rank: Awake, Load: 5},
		{Rank: Loading, Load: 1},
		{Rank: Loading, Load: 9},
		{Rank: Asleep},
		{Rank: Empty},
		{Rank: Idle, LastUsed: t0.Add(-time.Hour)},
		{Rank: Idle, LastUsed: t0.Add(-time.Minute)},
		{Rank: Queue, Load: 1},
		{Rank: Queue, Load: 3},
	}
	got := slices.Clone(want)
	slices.Reverse(got)
	slices.SortStableFunc(got, Compare)
	if !slices.Equal(got, want) {
		t.Fatalf("order:\n got %+v\nwant %+v", got, want)
	}
	if Compare(Candidate{Rank: Idle, LastUsed: t0, Load: 1}, Candidate{Rank: Idle, LastUsed: t0, Load: 2}) >= 0 {
		t.Fatal("idle pools used at the same time: the lower load is not first")
	}
	if Compare(Candidate{Rank: Empty, Load: 0}, Candidate{Rank: Empty, Load: 0}) != 0 {
		t.Fatal("equal candidates do not tie")
	}
}

func TestRankString(t *testing.T) {
	for r, want := range map[Rank]string{Awake: "awake", Loading: "loading", Asleep: "asleep", Empty: "empty", Idle: "idle", Queue: "queue", 0: "none", 99: "none"} {
		if r.String() != want {
			t.Errorf("%d: %q, want %q", int(r), r.String(), want)
		}
	}
}
