package pool

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// sleepProfile is a level-1 sleep-enabled profile run by the simulator
// through a shell that leaves a `sleep` child in the engine's process group
// and then execs the simulator: the group outlives the engine's own process
// unless the pool reaps it.
func sleepProfile(id string, flags ...string) string {
	sim := append([]string{"exec", "{poold}", "engine-sim", "/models/" + id, "--port", "{port}", "--served-model-name", "{id}", "--enable-sleep-mode"}, flags...)
	cmd := []string{"sh", "-c", "sleep 300 & " + strings.Join(sim, " ")}
	b, _ := json.Marshal(map[string]any{"id": id, "model": "m", "command": cmd, "sleep": map[string]any{"level": 1}, "weightBytes": 1000})
	return string(b)
}

// runSleepSet runs a Set for cfg with opts, its Launch.Self set to the test binary
// (the simulator); the returned stop ends it and waits for its pools to shut
// down (also run when the test ends).
func runSleepSet(t *testing.T, cfg *profile.Config, opts Options) (*Set, func()) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts.Launch.Self = self
	s := NewSet(cfg, opts)
	ctx, cancel := context.WithCancel(context.Background())
	s.Run(ctx)
	stop := func() {
		cancel()
		s.Wait()
	}
	t.Cleanup(stop)
	return s, stop
}

// use acquires a lease for id and releases it at once.
func use(t *testing.T, s *Set, cfg *profile.Config, id string) {
	t.Helper()
	acquire(t, s, cfg, id).Release()
}

// asleep returns a condition that holds when exactly ids sleep in the pool,
// least recently used first.
func asleep(ids ...string) func(statusapi.Pool) bool {
	return func(st statusapi.Pool) bool {
		got := make([]string, len(st.Sleeping))
		for i, sl := range st.Sleeping {
			got[i] = sl.Profile
		}
		return slices.Equal(got, ids)
	}
}

// waitGroupMembers polls until process group pgid has at least n live
// members, failing after 10 s.
func waitGroupMembers(t *testing.T, pgid, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(groupMembers(pgid)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d has members %v, want at least %d", pgid, groupMembers(pgid), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitGroupGoneT polls until process group pgid has no live member, failing
// after 20 s.
func waitGroupGoneT(t *testing.T, pgid int, what string) {
	t.Helper()
	if !waitGroupGone(pgid, 20*time.Second) {
		t.Fatalf("%s: process group %d still has live members %v", what, pgid, groupMembers(pgid))
	}
}

// sleeperPID is the pid of profile id's sleeping engine in st.
func sleeperPID(t *testing.T, st statusapi.Pool, id string) int {
	t.Helper()
	for _, sl := range st.Sleeping {
		if sl.Profile == id {
			return sl.PID
		}
	}
	t.Fatalf("%s does not sleep: %+v", id, st.Sleeping)
	return 0
}

const sleepPool = `{"name": "a", "gpus": [0], "default": "x"}`

func TestSleeperThatExitsIsRemovedAndReaped(t *testing.T) {
	cfg := reloadConfig(t, sleepPool, sleepProfile("x"), sleepProfile("y"))
	obs := &exitObserver{}
	s, _ := runSleepSet(t, cfg, Options{Observer: obs})
	waitFor(t, s, "a", "x ready", readyWith("x"))
	use(t, s, cfg, "y")
	st := waitFor(t, s, "a", "x asleep", asleep("x"))
	pid := sleeperPID(t, st, "x")
	waitGroupMembers(t, pid, 2) // the simulator and the shell's sleep child

	// The engine's own process dies; its sleep child lives on in the group.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "a", "x gone from the sleepers", asleep())
	waitGroupGoneT(t, pid, "the exited sleeper's group")
	// Reported once the group is reaped, just after the check above.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		obs.mu.Lock()
		exits := slices.Clone(obs.exits)
		obs.mu.Unlock()
		if slices.Contains(exits, "x:crashed") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine exits %v, want x:crashed", exits)
		}
	}
	if st := s.Pool("a").Status(); !readyWith("y")(st) {
		t.Fatalf("pool after the sleeper exited: %+v, want y ready", st)
	}
	// x starts cold again.
	use(t, s, cfg, "x")
	st = waitFor(t, s, "a", "y asleep", asleep("y"))
	if st.Engine == nil || st.Engine.PID == pid {
		t.Fatalf("x serves on %+v, want a new engine (old pid %d)", st.Engine, pid)
	}
}

func TestApplyStopsStaleSleeper(t *testing.T) {
	for _, tt := range []struct {
		name string
		next []string // profiles after the reload; y stays as it was
	}{
		{"removed", []string{sleepProfile("y")}},
		{"changed", []string{sleepProfile("x", "--sim-tokens", "5"), sleepProfile("y")}},
		{"sleep off", []string{strings.Replace(sleepProfile("x"), `"sleep":{"level":1},`, "", 1), sleepProfile("y")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := reloadConfig(t, sleepPool, sleepProfile("x"), sleepProfile("y"))
			s, _ := runSleepSet(t, cfg, Options{})
			waitFor(t, s, "a", "x ready", readyWith("x"))
			use(t, s, cfg, "y")
			st := waitFor(t, s, "a", "x asleep", asleep("x"))
			pid, ypid := sleeperPID(t, st, "x"), st.Engine.PID
			waitGroupMembers(t, pid, 2)

			next := reloadConfig(t, `{"name": "a", "gpus": [0]}`, tt.next...)
			if x := next.Lookup("x"); tt.name == "sleep off" && x.SleepLevel() != 0 {
				t.Fatal("test profile x still sleeps")
			}
			s.Apply(next)
			waitFor(t, s, "a", "x's sleeper stopped", asleep())
			waitGroupGoneT(t, pid, "the stale sleeper's group")
			if st := s.Pool("a").Status(); !readyWith("y")(st) || st.Engine.PID != ypid {
				t.Fatalf("pool after the reload: %+v, want y still ready on pid %d", st, ypid)
			}
		})
	}
}

func TestApplyKeepsUnchangedSleeper(t *testing.T) {
	cfg := reloadConfig(t, sleepPool, sleepProfile("x"), sleepProfile("y"))
	s, _ := runSleepSet(t, cfg, Options{})
	waitFor(t, s, "a", "x ready", readyWith("x"))
	use(t, s, cfg, "y")
	pid := sleeperPID(t, waitFor(t, s, "a", "x asleep", asleep("x")), "x")

	// Only a timeout changes: x's engine is the same, so it sleeps on and wakes.
	next := reloadConfig(t, sleepPool, strings.Replace(sleepProfile("x"), `"id"`, `"stopTimeout": "7s", "id"`, 1), sleepProfile("y"))
	s.Apply(next)
	use(t, s, next, "x")
	st := waitFor(t, s, "a", "x awake, y asleep", asleep("y"))
	if !readyWith("x")(st) || st.Engine.PID != pid {
		t.Fatalf("pool after the reload: %+v, want x woken on pid %d", st, pid)
	}
}

func TestShutdownStopsEverySleeper(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0], "default": "x", "maxSleeping": 2}`,
		sleepProfile("x"), sleepProfile("y"), sleepProfile("z"))
	s, stop := runSleepSet(t, cfg, Options{})
	waitFor(t, s, "a", "x ready", readyWith("x"))
	use(t, s, cfg, "y")
	use(t, s, cfg, "z")
	st := waitFor(t, s, "a", "x and y asleep", asleep("x", "y"))
	if !readyWith("z")(st) {
		t.Fatalf("pool: %+v, want z ready", st)
	}
	pids := []int{sleeperPID(t, st, "x"), sleeperPID(t, st, "y"), st.Engine.PID}
	for _, pid := range pids {
		waitGroupMembers(t, pid, 2)
	}
	stop()
	for _, pid := range pids {
		if m := groupMembers(pid); len(m) != 0 {
			t.Errorf("after shutdown, process group %d has live members %v", pid, m)
		}
	}
	if st := s.Pool("a").Status(); len(st.Sleeping) != 0 {
		t.Errorf("after shutdown, sleeping: %+v", st.Sleeping)
	}
}
