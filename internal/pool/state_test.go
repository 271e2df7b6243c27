package pool

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/poold/poold/internal/profile"
)

// allStates are the states a pool has.
var allStates = []State{StateEmpty, StateStarting, StateReady, StateDraining, StateStopping, StateSleeping, StateFailed}

func TestTransitionsAllowed(t *testing.T) {
	if len(transitions) != len(allStates) {
		t.Errorf("the table has %d states, the pool %d", len(transitions), len(allStates))
	}
	for _, from := range allStates {
		if _, ok := transitions[from]; !ok {
			t.Errorf("state %q missing from the table", from)
		}
		if err := checkTransition(from, from); err != nil {
			t.Errorf("staying in %q: %v", from, err)
		}
		for _, to := range transitions[from] {
			if err := checkTransition(from, to); err != nil {
				t.Errorf("%q to %q is in the table but refused: %v", from, to, err)
			}
		}
	}
}

func TestTransitionsRefused(t *testing.T) {
	for _, c := range []struct{ from, to State }{
		{StateEmpty, StateDraining}, // nothing serves to drain
		{StateEmpty, StateStopping}, // nothing to stop
		{StateEmpty, StateSleeping}, // nothing to put to sleep
		{StateEmpty, StateFailed},   // nothing ran to fail
		{StateStarting, StateEmpty}, // a start ends ready or failed
		{StateStarting, StateDraining},
		{StateStarting, StateSleeping},
		{StateReady, StateStarting}, // the engine serving is stopped first
		{StateDraining, StateStarting},
		{StateStopping, StateReady}, // a stopped engine does not serve
		{StateStopping, StateDraining},
		{StateSleeping, StateReady}, // a wake goes through Starting
		{StateSleeping, StateDraining},
		{StateFailed, StateReady}, // a failed pool serves after a start
		{StateFailed, StateDraining},
		{StateFailed, StateSleeping},
	} {
		err := checkTransition(c.from, c.to)
		if err == nil {
			t.Errorf("%q to %q allowed", c.from, c.to)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, c.from.String()) || !strings.Contains(msg, c.to.String()) {
			t.Errorf("%q to %q: error %q names neither", c.from, c.to, msg)
		}
	}
	if err := checkTransition(State(len(wireStates)), StateEmpty); err == nil {
		t.Error("a state not in the table may move")
	}
}

// TestSetStateRefusesInvalid checks that an invalid transition leaves the
// pool's state as it was, logged as an error, and that in a test binary it
// panics.
func TestSetStateRefusesInvalid(t *testing.T) {
	cfg, err := profile.Parse([]byte(`{"pools": [{"name": "g", "gpus": [0]}], "profiles": []}`))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	p := newPool(cfg.Pool("g"), cfg, Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	since := p.since
	func() {
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(r.(string), "invalid pool state transition") {
				t.Errorf("recovered %v, want the invalid transition's panic", r)
			}
		}()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.setStateLocked(StateDraining)
	}()
	if !strings.Contains(logs.String(), `"level":"ERROR"`) || !strings.Contains(logs.String(), "invalid pool state transition") {
		t.Errorf("no ERROR logged for the invalid transition:\n%s", logs.String())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != StateEmpty || !p.since.Equal(since) || !p.drainedAt.IsZero() {
		t.Errorf("after a refused transition: state %q, since %v (was %v), drainedAt %v", p.state, p.since, since, p.drainedAt)
	}
	p.setStateLocked(StateStarting)
	if p.state != StateStarting {
		t.Errorf("state %q after an allowed transition, want %q", p.state, StateStarting)
	}
}
