package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/enginesim"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// TestMain lets this test binary serve as an engine, and as its shim:
// profiles run `{poold} engine-sim …`, and {poold} is the test binary
// itself.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "engine-sim" {
		os.Exit(enginesim.Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "engine-shim" {
		os.Exit(shimMain(os.Args[2:], os.Stderr))
	}
	os.Exit(m.Run())
}

// simProfile is a profile run by the simulator, with extra engine-sim flags.
func simProfile(id string, pools []string, flags ...string) string {
	cmd := append([]string{"{poold}", "engine-sim", "/models/" + id, "--port", "{port}", "--served-model-name", "{id}"}, flags...)
	b, _ := json.Marshal(map[string]any{"id": id, "model": "m", "pools": pools, "command": cmd})
	return string(b)
}

// reloadConfig renders a profiles file from pool entries and profiles.
func reloadConfig(t *testing.T, pools string, profiles ...string) *profile.Config {
	t.Helper()
	cfg, err := profile.Parse([]byte(`{"pools": [` + pools + `],
	  "defaults": {"stopTimeout": "5s", "startupTimeout": "20s", "minResidency": "0s"},
	  "profiles": [` + strings.Join(profiles, ",") + `]}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

// runSet runs a Set for cfg until the test ends, then checks that every
// engine is gone.
func runSet(t *testing.T, cfg *profile.Config) *Set {
	t.Helper()
	return runSetWith(t, cfg, Options{})
}

// runSetWith is runSet with opts, but Self (the test binary).
func runSetWith(t *testing.T, cfg *profile.Config, opts Options) *Set {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts.Launch = profile.Launch{Self: self}
	s := NewSet(cfg, opts)
	ctx, cancel := context.WithCancel(context.Background())
	s.Run(ctx)
	t.Cleanup(func() {
		cancel()
		s.Wait()
	})
	return s
}

// waitFor polls the named pool's status until cond holds, failing after 20 s.
func waitFor(t *testing.T, s *Set, pool, what string, cond func(statusapi.Pool) bool) statusapi.Pool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last statusapi.Pool
	for time.Now().Before(deadline) {
		if p := s.Pool(pool); p != nil {
			last = p.Status()
			if cond(last) {
				return last
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("pool %s: %s not reached within 20s; last: %+v", pool, what, last)
	return last
}

func readyWith(id string) func(statusapi.Pool) bool {
	return func(st statusapi.Pool) bool {
		return st.State == StateReady.String() && st.Profile != nil && *st.Profile == id && st.Engine != nil
	}
}

func acquire(t *testing.T, s *Set, cfg *profile.Config, id string) *Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := s.Acquire(ctx, cfg.Lookup(id), "", Caller{}, nil)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", id, err)
	}
	return l
}

const twoPools = `{"name": "a", "gpus": [0], "default": "x"}, {"name": "b", "gpus": [1], "default": "y"}`

func TestApplyUnchangedTouchesNothing(t *testing.T) {
	cfg := reloadConfig(t, twoPools, simProfile("x", []string{"a"}), simProfile("y", []string{"b"}))
	s := runSet(t, cfg)
	a := waitFor(t, s, "a", "ready", readyWith("x"))
	b := waitFor(t, s, "b", "ready", readyWith("y"))

	// Only aliases and a timeout change: nothing about the engines.
	next := reloadConfig(t, twoPools,
		strings.Replace(simProfile("x", []string{"a"}), `"id"`, `"aliases": ["ex"], "stopTimeout": "7s", "id"`, 1),
		simProfile("y", []string{"b"}))
	if notes := s.Apply(next); len(notes) != 0 {
		t.Fatalf("Apply: %q, want no change", notes)
	}
	if st := s.Pool("a").Status(); st.State != StateReady.String() || st.Engine.PID != a.Engine.PID {
		t.Fatalf("pool a after the reload: %+v, want ready on pid %d", st, a.Engine.PID)
	}
	if st := s.Pool("b").Status(); st.State != StateReady.String() || st.Engine.PID != b.Engine.PID {
		t.Fatalf("pool b after the reload: %+v, want ready on pid %d", st, b.Engine.PID)
	}
	// The new alias is servable at once, on the running engine.
	l := acquire(t, s, next, "ex")
	l.Release()
}

func TestApplyChangedProfileRestartsAfterItsLeases(t *testing.T) {
	cfg := reloadConfig(t, twoPools, simProfile("x", []string{"a"}), simProfile("y", []string{"b"}))
	s := runSet(t, cfg)
	a := waitFor(t, s, "a", "ready", readyWith("x"))
	b := waitFor(t, s, "b", "ready", readyWith("y"))
	held := acquire(t, s, cfg, "x")

	next := reloadConfig(t, twoPools, simProfile("x", []string{"a"}, "--sim-tokens", "5"), simProfile("y", []string{"b"}))
	notes := s.Apply(next)
	if want := []string{`pool "a": loaded profile "x" changed: draining, then restarting`}; !slices.Equal(notes, want) {
		t.Fatalf("Apply: %q, want %q", notes, want)
	}
	st := s.Pool("a").Status()
	if st.State != StateDraining.String() || st.Engine == nil || st.Engine.PID != a.Engine.PID || st.InFlight != 1 {
		t.Fatalf("pool a while its lease is open: %+v, want draining on pid %d with 1 in flight", st, a.Engine.PID)
	}
	if !alive(a.Engine.PID) {
		t.Fatal("the old engine died while its lease was open")
	}
	// A new request for x waits for the restart.
	got := make(chan *Lease, 1)
	go func() {
		l, err := s.Acquire(context.Background(), next.Lookup("x"), "", Caller{}, nil)
		if err != nil {
			t.Errorf("Acquire after the reload: %v", err)
		}
		got <- l
	}()
	waitFor(t, s, "a", "the new request queued", func(st statusapi.Pool) bool { return st.Waiting["x"] == 1 })
	held.Release()
	l := <-got
	if l == nil {
		return
	}
	defer l.Release()
	st = waitFor(t, s, "a", "ready on a new engine", readyWith("x"))
	if st.Engine.PID == a.Engine.PID || alive(a.Engine.PID) {
		t.Fatalf("engine pid %d (old %d, alive %t): want a new engine and the old one gone", st.Engine.PID, a.Engine.PID, alive(a.Engine.PID))
	}
	if e := s.Pool("a").eng; !slices.Contains(e.argv, "--sim-tokens") {
		t.Fatalf("restarted engine runs %q, want the new flags", e.argv)
	}
	if st := s.Pool("b").Status(); st.Engine.PID != b.Engine.PID {
		t.Fatalf("pool b's engine changed: pid %d, want %d", st.Engine.PID, b.Engine.PID)
	}
}

func TestApplyChangedIdleProfileRestartsAtOnce(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`, simProfile("x", nil))
	s := runSet(t, cfg)
	a := waitFor(t, s, "a", "ready", readyWith("x"))
	s.Apply(reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`, simProfile("x", nil, "--sim-tokens", "3")))
	waitFor(t, s, "a", "restarted", func(st statusapi.Pool) bool {
		return readyWith("x")(st) && st.Engine.PID != a.Engine.PID
	})
}

func TestApplyRemovedProfile(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`, simProfile("x", nil), simProfile("z", nil))
	s := runSet(t, cfg)
	a := waitFor(t, s, "a", "ready", readyWith("x"))
	held := acquire(t, s, cfg, "x")

	next := reloadConfig(t, `{"name": "a", "gpus": [0]}`, simProfile("z", nil))
	s.Apply(next)
	// A request that resolved x before the reload is refused, not queued.
	if _, err := s.Acquire(context.Background(), cfg.Lookup("x"), "", Caller{}, nil); !errors.Is(err, ErrProfileRemoved) {
		t.Fatalf("Acquire(removed x) = %v, want ErrProfileRemoved", err)
	}
	if !alive(a.Engine.PID) {
		t.Fatal("the engine died while its lease was open")
	}
	held.Release()
	waitFor(t, s, "a", "empty", func(st statusapi.Pool) bool { return st.State == StateEmpty.String() && st.Engine == nil })
	if alive(a.Engine.PID) {
		t.Fatalf("removed profile's engine %d still runs", a.Engine.PID)
	}
}

func TestApplyNewDefaultPreloadsEmptyPool(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0]}`, simProfile("x", nil))
	s := runSet(t, cfg)
	if st := s.Pool("a").Status(); st.State != StateEmpty.String() {
		t.Fatalf("pool a: %+v, want empty", st)
	}
	notes := s.Apply(reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`, simProfile("x", nil)))
	if want := []string{`pool "a": default "x": preloading`}; !slices.Equal(notes, want) {
		t.Fatalf("Apply: %q, want %q", notes, want)
	}
	waitFor(t, s, "a", "preloaded", readyWith("x"))
}

func TestApplyAddsAndRemovesPools(t *testing.T) {
	cfg := reloadConfig(t, twoPools, simProfile("x", []string{"a"}), simProfile("y", []string{"b"}))
	s := runSet(t, cfg)
	a := waitFor(t, s, "a", "ready", readyWith("x"))
	b := waitFor(t, s, "b", "ready", readyWith("y"))
	held := acquire(t, s, cfg, "y")
	removed := s.Pool("b")

	next := reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}, {"name": "c", "gpus": [1], "default": "y"}`,
		simProfile("x", []string{"a"}), simProfile("y", []string{"c"}))
	notes := s.Apply(next)
	want := []string{`pool "c": added`, `pool "b": removed: draining, then stopping`}
	if !slices.Equal(notes, want) {
		t.Fatalf("Apply: %q, want %q", notes, want)
	}
	if s.Pool("b") != nil || len(s.Pools()) != 2 {
		t.Fatalf("pools after the reload: %d, b present %t", len(s.Pools()), s.Pool("b") != nil)
	}
	// The removed pool refuses new work but keeps serving its open lease.
	if _, err := removed.Acquire(context.Background(), cfg.Lookup("y"), Caller{}, nil); !errors.Is(err, ErrPoolRemoved) {
		t.Fatalf("Acquire on the removed pool = %v, want ErrPoolRemoved", err)
	}
	if !alive(b.Engine.PID) {
		t.Fatal("the removed pool's engine died while its lease was open")
	}
	c := waitFor(t, s, "c", "ready", readyWith("y"))
	held.Release()
	select {
	case <-removed.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the removed pool's loop did not end after its last lease")
	}
	if alive(b.Engine.PID) {
		t.Fatalf("the removed pool's engine %d still runs", b.Engine.PID)
	}
	if st := s.Pool("a").Status(); st.Engine.PID != a.Engine.PID {
		t.Fatalf("pool a's engine changed: %d, want %d", st.Engine.PID, a.Engine.PID)
	}
	l := acquire(t, s, next, "y")
	if l.Pool != "c" || l.Target.Port() != fmt.Sprint(c.Engine.Port) {
		t.Fatalf("lease for y on %s %s, want pool c port %d", l.Pool, l.Target, c.Engine.Port)
	}
	l.Release()
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	st, err := proc.ProcStat(pid)
	return err == nil && st.State != 'Z' && st.State != 'X'
}

func TestHealthyDetectsAStuckPool(t *testing.T) {
	cfg := reloadConfig(t, twoPools, simProfile("x", []string{"a"}), simProfile("y", []string{"b"}))
	s := NewSet(cfg, Options{})
	if err := s.Healthy(time.Second); err != nil {
		t.Fatalf("Healthy: %v", err)
	}
	p := s.Pool("b")
	p.mu.Lock()
	err := s.Healthy(20 * time.Millisecond)
	p.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), `pool "b"`) {
		t.Fatalf("Healthy with pool b stuck: %v, want an error naming it", err)
	}
}

func TestApplyRefusesWaitersOfARemovedProfile(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`, simProfile("x", nil), simProfile("z", nil))
	s := runSet(t, cfg)
	waitFor(t, s, "a", "ready", readyWith("x"))
	held := acquire(t, s, cfg, "x") // keeps z waiting: residency 0, but a lease is open
	defer held.Release()
	got := make(chan error, 1)
	go func() {
		_, err := s.Acquire(context.Background(), cfg.Lookup("z"), "", Caller{}, nil)
		got <- err
	}()
	waitFor(t, s, "a", "z queued", func(st statusapi.Pool) bool { return st.Waiting["z"] == 1 })
	notes := s.Apply(reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`, simProfile("x", nil)))
	if want := []string{`pool "a": profile "z" removed: its queued requests are refused`}; !slices.Equal(notes, want) {
		t.Fatalf("Apply: %q, want %q", notes, want)
	}
	if err := <-got; !errors.Is(err, ErrProfileRemoved) {
		t.Fatalf("queued request for the removed profile: %v, want ErrProfileRemoved", err)
	}
}

// An engine keeps the GPUs it was started with: when a reload moves its pool
// to other GPUs, the stop of the retired engine checks the GPUs it ran on;
// and a reload's write of the pool's spec races with no swap (-race).
func TestApplyNewGPUsStopChecksTheOldOnes(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x"}`, simProfile("x", []string{"a"}))
	moved := reloadConfig(t, `{"name": "a", "gpus": [1], "default": "x"}`, simProfile("x", []string{"a"}))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	vram := &fakeVRAM{total: 1 << 30}
	s := NewSet(cfg, Options{Launch: profile.Launch{Self: self}, VRAM: vram})
	ctx, cancel := context.WithCancel(context.Background())
	s.Run(ctx)
	t.Cleanup(func() { cancel(); s.Wait() })
	waitFor(t, s, "a", "ready on GPU 0", readyWith("x"))

	s.Apply(moved)
	waitFor(t, s, "a", "ready on GPU 1", func(st statusapi.Pool) bool {
		return readyWith("x")(st) && slices.Equal(st.GPUs, []int{1})
	})
	vram.mu.Lock()
	watched := slices.Clone(vram.watched)
	vram.mu.Unlock()
	if len(watched) != 1 || !slices.Equal(watched[0], []int{0}) {
		t.Fatalf("the stop of the engine that ran on GPU 0 watched %v", watched)
	}

	// Reloads back and forth while the pool stops and starts its engine.
	for i := range 20 {
		if i%2 == 0 {
			s.Apply(cfg)
		} else {
			s.Apply(moved)
		}
		s.Pool("a").Status()
	}
	waitFor(t, s, "a", "ready on GPU 1", func(st statusapi.Pool) bool {
		return readyWith("x")(st) && slices.Equal(st.GPUs, []int{1})
	})
}
