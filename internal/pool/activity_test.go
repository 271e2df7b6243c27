package pool

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poold/poold/internal/activity"
	"github.com/poold/poold/internal/statusapi"
)

// activityLog records what an activity.Observer is told.
type activityLog struct {
	mu      sync.Mutex // guards changes and last
	changes []string   // "activity:profile"; "end" for activity.None
	last    time.Time
	backInT bool // a change came earlier than the one before it
}

func (l *activityLog) PoolActivity(pool string, gpus []int, a activity.Activity, profile string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if at.Before(l.last) {
		l.backInT = true
	}
	l.last = at
	s := string(a) + ":" + profile
	if a == activity.None {
		s = "end"
	}
	l.changes = append(l.changes, fmt.Sprintf("%s/%v/%s", pool, gpus, s))
}

func (l *activityLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.changes
	l.changes = nil
	return c
}

// waitActivity polls until the log's latest change is want.
func (l *activityLog) waitActivity(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l.mu.Lock()
		n := len(l.changes)
		last := ""
		if n > 0 {
			last = l.changes[n-1]
		}
		l.mu.Unlock()
		if last == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("last activity %q, want %q", last, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestActivityFollowsLeasesAndSwaps(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0, 1], "default": "x"}`, simProfile("x", nil), simProfile("y", nil))
	log := &activityLog{}
	s, stop := runSleepSet(t, cfg, Options{Activity: log})
	log.waitActivity(t, "a/[0 1]/idle:x")
	if got, want := log.take(), []string{"a/[0 1]/empty:", "a/[0 1]/swapping:x", "a/[0 1]/idle:x"}; !slices.Equal(got, want) {
		t.Fatalf("preload: %q, want %q", got, want)
	}

	// Two overlapping leases are one serving interval.
	l1 := acquire(t, s, cfg, "x")
	l2 := acquire(t, s, cfg, "x")
	if l1.CausedSwap || l2.CausedSwap {
		t.Error("a lease on the loaded profile claims to have caused a swap")
	}
	l1.Release()
	l2.Release()
	if got, want := log.take(), []string{"a/[0 1]/serving:x", "a/[0 1]/idle:x"}; !slices.Equal(got, want) {
		t.Fatalf("leases: %q, want %q", got, want)
	}

	// A request for y swaps: it is charged with the swap, a request that
	// queued behind it is not.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first := make(chan *Lease, 1)
	go func() {
		l, err := s.Acquire(ctx, cfg.Lookup("y"), "", Caller{}, nil)
		if err != nil {
			t.Errorf("Acquire(y): %v", err)
		}
		first <- l
	}()
	waitFor(t, s, "a", "y queued or loading", func(st statusapi.Pool) bool { return st.Waiting["y"] > 0 || st.SwitchingTo != nil })
	ly := acquire(t, s, cfg, "y")
	lf := <-first
	if lf == nil {
		t.FailNow()
	}
	if !lf.CausedSwap || ly.CausedSwap {
		t.Errorf("CausedSwap: first %v, second %v; want true, false", lf.CausedSwap, ly.CausedSwap)
	}
	lf.Release()
	ly.Release()
	if got, want := log.take(), []string{"a/[0 1]/swapping:y", "a/[0 1]/serving:y", "a/[0 1]/idle:y"}; !slices.Equal(got, want) {
		t.Fatalf("swap: %q, want %q", got, want)
	}

	stop()
	if got, want := log.take(), []string{"a/[0 1]/swapping:y", "a/[0 1]/empty:", "a/[0 1]/end"}; !slices.Equal(got, want) {
		t.Fatalf("shutdown: %q, want %q", got, want)
	}
	if log.backInT {
		t.Error("the observer was told of a change earlier than the one before")
	}
}

func TestActivityAsleepAfterUnload(t *testing.T) {
	cfg := reloadConfig(t, sleepPool, sleepProfile("x"), sleepProfile("y"))
	log := &activityLog{}
	s, _ := runSleepSet(t, cfg, Options{Activity: log})
	waitFor(t, s, "a", "x ready", readyWith("x"))
	use(t, s, cfg, "y")
	waitFor(t, s, "a", "x asleep", asleep("x"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Pool("a").Unload(ctx); err != nil {
		t.Fatal(err)
	}
	log.waitActivity(t, "a/[0]/asleep:x")
	got := strings.Join(log.take(), " ")
	// The swap to y: x is put to sleep (swapping), y starts; the unload
	// stops y (swapping) and leaves x asleep.
	if want := "a/[0]/swapping:y a/[0]/serving:y a/[0]/idle:y a/[0]/swapping: a/[0]/asleep:x"; !strings.HasSuffix(got, want) {
		t.Fatalf("activity %q, want it to end with %q", got, want)
	}
}
