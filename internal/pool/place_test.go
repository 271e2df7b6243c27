package pool

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// Two first requests for a profile join one pool even when the pools change
// between the first one's placement and its arrival: placement and arrival
// are atomic for a profile.
func TestConcurrentFirstRequestsJoinOnePool(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [1]}`,
		simProfile("p", nil), simProfile("q", nil, "--sim-load-delay", "300ms"))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := NewSet(cfg, Options{Launch: profile.Launch{Self: self}})
	firstP := make(chan *Pool, 1)   // the first request for p was placed here
	releaseP := make(chan struct{}) // lets it arrive
	secondP := make(chan *Pool, 1)  // the second request for p was placed here
	calls := 0
	s.placed = func(id string, p *Pool) {
		if id != "p" {
			return
		}
		calls++ // under p's placement mutex with the fix; the race detector would tell otherwise
		switch calls {
		case 1:
			firstP <- p
			<-releaseP
		case 2:
			secondP <- p
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.Run(ctx)
	t.Cleanup(func() { cancel(); s.Wait() })

	type result struct {
		lease *Lease
		err   error
	}
	acquire := func(id string) <-chan result {
		out := make(chan result, 1)
		go func() {
			actx, acancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer acancel()
			l, err := s.Acquire(actx, cfg.Lookup(id), "", Caller{}, nil)
			out <- result{l, err}
		}()
		return out
	}

	first := acquire("p")
	if p := <-firstP; p.Name() != "a" {
		t.Fatalf("the first request for p was placed on %s, want a (both empty, a first)", p.Name())
	}
	// Meanwhile q takes pool a: p's first request has not arrived there yet.
	q := acquire("q")
	waitFor(t, s, "a", "loading q", func(st statusapi.Pool) bool { return st.SwitchingTo != nil && *st.SwitchingTo == "q" })
	second := acquire("p")
	// Without atomic placement the second request finds a busy loading q
	// and b empty, and goes to b; with it, it waits for the first to arrive.
	select {
	case p := <-secondP:
		t.Errorf("the second request for p was placed (on %s) before the first arrived", p.Name())
	case <-time.After(time.Second):
	}
	close(releaseP)
	for _, r := range []<-chan result{q, first, second} { // q first: p waits for its lease to end
		got := <-r
		if got.err != nil {
			t.Fatalf("Acquire: %v", got.err)
		}
		if got.lease.Profile.ID == "p" && got.lease.Pool != "a" {
			t.Errorf("a request for p was served on pool %s: the model started twice", got.lease.Pool)
		}
		got.lease.Release()
	}
	if st := s.Pool("b").Status(); st.Engine != nil || st.State != StateEmpty.String() {
		t.Errorf("pool b started an engine: %+v", st)
	}
}
