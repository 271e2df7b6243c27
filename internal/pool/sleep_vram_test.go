package pool

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/poold/poold/internal/statusapi"
)

func TestSleepVRAMCheck(t *testing.T) {
	for _, tt := range []struct {
		name     string
		sleepErr error
	}{
		{"released", nil},
		{"not released", errors.New("gpu 0 lists pids [1] (foreign [])")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := reloadConfig(t, sleepPool, sleepProfile("x"), sleepProfile("y"))
			vram := &fakeVRAM{sleepErr: tt.sleepErr, total: 1 << 40}
			obs := &exitObserver{}
			s, _ := runSleepSet(t, cfg, Options{VRAM: vram, Observer: obs})
			pid := waitFor(t, s, "a", "x ready", readyWith("x")).Engine.PID
			waitGroupMembers(t, pid, 2) // the simulator and the shell's sleep child
			use(t, s, cfg, "y")         // the swap, x's sleep included, is over

			st := s.Pool("a").Status()
			vram.mu.Lock()
			gpus, pids, waited := vram.sleepGPUs, vram.sleepPIDs, vram.sleepWaited
			vram.mu.Unlock()
			if !slices.Equal(gpus, []int{0}) || !slices.Contains(pids, pid) || waited != 1 {
				t.Fatalf("sleep check: gpus %v pids %v waited %d times; want gpus [0], pids with %d, waited once", gpus, pids, waited, pid)
			}
			obs.mu.Lock()
			exits, held := slices.Clone(obs.exits), obs.sleepHeld
			obs.mu.Unlock()
			if tt.sleepErr == nil {
				if !asleep("x")(st) || sleeperPID(t, st, "x") != pid || held != 0 {
					t.Fatalf("sleeping %+v, SleepVRAMNotReleased %d times; want x asleep on pid %d, none", st.Sleeping, held, pid)
				}
				return
			}
			if !asleep()(st) || held != 1 || !slices.Contains(exits, "x:stopped") {
				t.Fatalf("sleeping %+v, SleepVRAMNotReleased %d times, exits %v; want none asleep, once, x:stopped", st.Sleeping, held, exits)
			}
			waitGroupGoneT(t, pid, "the sleeper that freed nothing")
			if !readyWith("y")(st) {
				t.Fatalf("pool: %+v, want y ready", st)
			}
		})
	}
}

func TestEvictSleepersForGPUMemory(t *testing.T) {
	// x, y, z declare weightBytes 1000: each needs 1000 bytes free. w declares
	// none (and its model is no directory): it needs a tenth of the total.
	const total = 100_000
	noWeights := strings.Replace(sleepProfile("w"), `,"weightBytes":1000`, "", 1)
	if strings.Contains(noWeights, "weightBytes") {
		t.Fatalf("profile w still declares its weights: %s", noWeights)
	}
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0, 1], "default": "x", "maxSleeping": 3}`,
		sleepProfile("x"), sleepProfile("y"), sleepProfile("z"), noWeights)
	vram := &fakeVRAM{total: total}
	obs := &exitObserver{}
	s, _ := runSleepSet(t, cfg, Options{VRAM: vram, Observer: obs})
	pids := map[string]int{"x": waitFor(t, s, "a", "x ready", readyWith("x")).Engine.PID}
	use(t, s, cfg, "y")
	use(t, s, cfg, "z")
	st := waitFor(t, s, "a", "x and y asleep", asleep("x", "y"))
	pids["y"], pids["z"] = sleeperPID(t, st, "y"), st.Engine.PID

	// check fails unless the pool's sleepers are want (least recently used
	// first) and Free was read reads times since it was scripted.
	check := func(step string, want []string, reads int) statusapi.Pool {
		t.Helper()
		st := s.Pool("a").Status()
		vram.mu.Lock()
		calls := vram.freeCalls
		vram.mu.Unlock()
		if !asleep(want...)(st) || calls != reads {
			t.Fatalf("%s: sleeping %+v after %d Free readings; want %v after %d", step, st.Sleeping, calls, want, reads)
		}
		return st
	}

	// Starting w: z falls asleep; 5000 and 9000 free are short of a tenth of
	// the total, so x then y are evicted; 20000 is enough.
	vram.setFree(5000, 9000, 20000)
	use(t, s, cfg, "w")
	pids["w"] = check("cold start of w", []string{"z"}, 3).Engine.PID
	waitGroupGoneT(t, pids["x"], "x, evicted first")
	waitGroupGoneT(t, pids["y"], "y, evicted second")

	// Starting y again (1000 bytes): w falls asleep; z is evicted for 500.
	vram.setFree(500, 2000)
	use(t, s, cfg, "y")
	check("cold start of y", []string{"w"}, 2)
	waitGroupGoneT(t, pids["z"], "z, evicted")

	// Waking w: y falls asleep and is evicted; w, being woken, is not; with
	// no sleeper left, w wakes anyway.
	ypid := s.Pool("a").Status().Engine.PID
	vram.setFree(0)
	use(t, s, cfg, "w")
	st = check("wake of w", nil, 2)
	if !readyWith("w")(st) || st.Engine.PID != pids["w"] {
		t.Fatalf("pool: %+v, want w woken on pid %d", st, pids["w"])
	}
	waitGroupGoneT(t, ypid, "y, evicted")

	obs.mu.Lock()
	exits := slices.Clone(obs.exits)
	obs.mu.Unlock()
	for _, want := range []string{"x:stopped", "y:stopped", "z:stopped"} {
		if !slices.Contains(exits, want) {
			t.Errorf("engine exits %v, want %s", exits, want)
		}
	}
}
