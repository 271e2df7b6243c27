package pool

import (
	"slices"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
)

// fellAsleep makes sleepers of the given profiles and host bytes, falling asleep
// one after another on a fake clock, in the order given.
func fellAsleep(clock *fakeClock, specs ...struct {
	id    string
	bytes int64
}) []*sleeper {
	var list []*sleeper
	for _, s := range specs {
		clock.now = clock.now.Add(time.Second)
		list = append(list, &sleeper{eng: &engine{profile: &profile.Profile{ID: s.id}}, since: clock.Now(), hostBytes: s.bytes})
	}
	return list
}

func ids(list []*sleeper) []string {
	var out []string
	for _, sl := range list {
		out = append(out, sl.eng.profile.ID)
	}
	return out
}

type sl = struct {
	id    string
	bytes int64
}

func TestSleepRoom(t *testing.T) {
	clock := &fakeClock{now: t0}
	// a fell asleep first, then b, then c.
	abc := fellAsleep(clock, sl{"a", 100}, sl{"b", 200}, sl{"c", 300})
	// The pool's list is not in age order (a woken and re-slept engine, a
	// reload): the decision goes by the time each fell asleep.
	shuffled := []*sleeper{abc[2], abc[0], abc[1]}
	tests := []struct {
		name        string
		list        []*sleeper
		maxSleeping int
		need        int64
		budget      int64
		held        int64
		evict       []string
		fits        bool
	}{
		{"room under maxSleeping, no budget", abc, 4, 500, 0, 600, nil, true},
		{"at maxSleeping: the longest asleep goes", shuffled, 3, 0, 0, 600, []string{"a"}, true},
		{"well over maxSleeping (lowered)", shuffled, 1, 0, 0, 600, []string{"a", "b", "c"}, true},
		{"budget: no more than must go", shuffled, 9, 200, 750, 600, []string{"a"}, true},
		{"budget: the oldest first, until it fits", shuffled, 9, 300, 750, 600, []string{"a", "b"}, true},
		{"budget: other pools' sleepers count in held", shuffled, 9, 50, 1000, 900, nil, true},
		{"budget and maxSleeping together", shuffled, 2, 400, 800, 600, []string{"a", "b"}, true},
		{"no room even with every sleeper gone: nobody is evicted", shuffled, 2, 950, 1000, 700, nil, false},
		{"need alone exceeds the budget", nil, 1, 2000, 1000, 0, nil, false},
		{"maxSleeping zero", abc, 0, 0, 0, 600, nil, false},
		{"empty pool, room", nil, 1, 10, 100, 0, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evict, fits := sleepRoom(tt.list, tt.maxSleeping, tt.need, tt.budget, tt.held)
			if fits != tt.fits || !slices.Equal(ids(evict), tt.evict) {
				t.Fatalf("sleepRoom = %v, %v; want %v, %v", ids(evict), fits, tt.evict, tt.fits)
			}
		})
	}
}

// byAge orders by when each fell asleep, and keeps the list it was given.
func TestByAge(t *testing.T) {
	clock := &fakeClock{now: t0}
	list := fellAsleep(clock, sl{"a", 0}, sl{"b", 0}, sl{"c", 0})
	list = []*sleeper{list[1], list[2], list[0]}
	if got := ids(byAge(list)); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("byAge = %v", got)
	}
	if got := ids(list); !slices.Equal(got, []string{"b", "c", "a"}) {
		t.Fatalf("byAge changed its input: %v", got)
	}
}
