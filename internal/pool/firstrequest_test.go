package pool

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// skewClock is the real clock, moved forward at will.
type skewClock struct{ ahead atomic.Int64 }

func (c *skewClock) Now() time.Time       { return time.Now().Add(time.Duration(c.ahead.Load())) }
func (c *skewClock) skip(d time.Duration) { c.ahead.Add(int64(d)) }

// seen is the engine exits observed so far, profile:reason.
func (o *exitObserver) seen() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.exits)
}

// ask sends one chat request to the lease's engine and returns its status.
func ask(t *testing.T, l *Lease) int {
	t.Helper()
	resp, err := http.Post(l.Target.String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`))
	if err != nil {
		t.Fatalf("request to the engine: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// waitExits waits until the observer has seen want engine exits.
func waitExits(t *testing.T, o *exitObserver, want ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !slices.Equal(o.seen(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("engine exits %q, want %q", o.seen(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An engine that dies at its first request every time (vLLM's CPU build
// given a model whose attention head size it has no kernel for): each
// death goes on the restart backoff's streak, however long the engine was
// ready before its first request came, and from the second in a row the
// profile's requests are refused at once, with the engine's own reason.
func TestFirstRequestDeathsHoldTheProfile(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`,
		simProfile("x", []string{"a"}, "--sim-die-on-first-request", "--sim-watchdog-interval", "100ms"))
	obs := &exitObserver{}
	clock := &skewClock{}
	s := runSetWith(t, cfg, Options{RestartBackoff: time.Minute, MaxRestartBackoff: time.Minute, Observer: obs, Now: clock.Now})
	waitFor(t, s, "a", "ready", readyWith("x"))
	var exits []string
	for death := 1; death <= 2; death++ {
		l := acquire(t, s, cfg, "x") // the second starts a fresh engine: one failure waits nothing
		clock.skip(time.Hour)        // ready, idle, for longer than restart-backoff-max
		if code := ask(t, l); code != http.StatusInternalServerError {
			t.Fatalf("death %d: the first request got %d, want the engine's 500", death, code)
		}
		l.Release()
		exits = append(exits, "x:"+statusapi.ExitFirstRequest)
		waitExits(t, obs, exits...)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := s.Acquire(ctx, cfg.Lookup("x"), "", Caller{}, nil)
	var qe *QueueError
	if !errors.As(err, &qe) || !errors.Is(err, ErrBackoff) || qe.RetryAfter <= 0 || qe.RetryAfter > time.Minute {
		t.Fatalf("a request after two deaths at the first request: %v; want a backoff refusal of at most 1m", err)
	}
	for _, want := range []string{"after 2 consecutive failures", `engine "x" died at its first request, before any succeeded`,
		"reason: RuntimeError: Unsupported CPU attention configuration: head_dim=16"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("refusal %q lacks %q", err, want)
		}
	}
	st := s.Pool("a").Status()
	if st.Engine != nil || st.SwitchingTo != nil {
		t.Fatalf("the refusal started an engine: %+v", st)
	}
	f := st.Failing
	if f == nil || f.Profile != "x" || f.Failures != 2 || f.Exit != statusapi.ExitFirstRequest ||
		f.Reason != "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=1" ||
		!strings.Contains(f.LastError, "died at its first request") || f.RetryAt == nil || f.RetryAt.Sub(clock.Now()) > time.Minute {
		t.Fatalf("/status failing: %+v, want x failing twice at its first request, with the reason and a retry within 1m", f)
	}
	waitExits(t, obs, exits...)

	// An operator who fixed the cause clears the backoff: the next request
	// starts the engine at once.
	if id := s.Pool("a").ClearBackoff(); id != "x" {
		t.Fatalf("ClearBackoff cleared %q, want x", id)
	}
	if st := s.Pool("a").Status(); st.Failing != nil {
		t.Fatalf("failing after the clear: %+v", st.Failing)
	}
	if id := s.Pool("a").ClearBackoff(); id != "" {
		t.Fatalf("a second ClearBackoff cleared %q, want nothing", id)
	}
	acquire(t, s, cfg, "x").Release()
	waitFor(t, s, "a", "ready again", readyWith("x"))
}

// An engine that answered a request successfully is no longer on trial:
// its death is a crash, and the streak of first-request deaths does not
// go on through it.
func TestCrashAfterASuccessIsNoFirstRequestDeath(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`, simProfile("x", []string{"a"}))
	obs := &exitObserver{}
	s := runSetWith(t, cfg, Options{Observer: obs})
	waitFor(t, s, "a", "ready", readyWith("x"))
	l := acquire(t, s, cfg, "x")
	if code := ask(t, l); code != http.StatusOK {
		t.Fatalf("request: %d", code)
	}
	l.Succeeded()
	l.Release()
	st := s.Pool("a").Status()
	if err := syscall.Kill(st.Engine.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExits(t, obs, "x:"+statusapi.ExitCrashed)
	if st := s.Pool("a").Status(); st.LastError == nil || strings.Contains(*st.LastError, "first request") {
		t.Fatalf("lastError %v, want a crash, not a death at the first request", st.LastError)
	}
}
