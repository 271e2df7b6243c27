package pool

import (
	"errors"
	"slices"
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
	// vLLM's rule on each of the pool's two GPUs of 100000 bytes: free at
	// least 0.9 of the total (no profile sets --gpu-memory-utilization),
	// less what a sleeper about to wake holds there.
	const total = 100_000
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0, 1], "default": "x", "maxSleeping": 3}`,
		sleepProfile("x"), sleepProfile("y"), sleepProfile("z"), sleepProfile("w"))
	vram := &fakeVRAM{total: total}
	obs := &exitObserver{}
	s, _ := runSleepSet(t, cfg, Options{VRAM: vram, Observer: obs})
	pids := map[string]int{"x": waitFor(t, s, "a", "x ready", readyWith("x")).Engine.PID}
	use(t, s, cfg, "y")
	use(t, s, cfg, "z")
	st := waitFor(t, s, "a", "x and y asleep", asleep("x", "y"))
	pids["y"], pids["z"] = sleeperPID(t, st, "y"), st.Engine.PID

	// check fails unless the pool's sleepers are want (least recently used
	// first) and the GPUs were read reads times since they were scripted.
	check := func(step string, want []string, reads int) statusapi.Pool {
		t.Helper()
		st := s.Pool("a").Status()
		vram.mu.Lock()
		calls := vram.readCalls
		vram.mu.Unlock()
		if !asleep(want...)(st) || calls != reads {
			t.Fatalf("%s: sleeping %+v after %d GPU readings; want %v after %d", step, st.Sleeping, calls, want, reads)
		}
		return st
	}

	// Starting w: z falls asleep. GPU 1 short, then GPU 0 short (the sum
	// would do both times): x then y are evicted; then both have room.
	vram.setReads(vram.used(0, 20_000), vram.used(10_001, 0), vram.used(10_000, 10_000))
	use(t, s, cfg, "w")
	pids["w"] = check("cold start of w", []string{"z"}, 3).Engine.PID
	waitGroupGoneT(t, pids["x"], "x, evicted first")
	waitGroupGoneT(t, pids["y"], "y, evicted second")

	// Waking z: w falls asleep. GPU 0 lacks 90000 free, but z holds 30000 of
	// what is used there, which it reclaims: no eviction.
	zHolds := vram.used(40_000, 0)
	zHolds[0].Processes = []statusapi.GPUProcess{{PID: pids["z"], UsedBytes: 30_000}, {PID: 1, UsedBytes: 10_000}}
	vram.setReads(zHolds)
	use(t, s, cfg, "z")
	check("wake of z", []string{"w"}, 1)

	// Waking w: z falls asleep and is evicted; w, being woken, is not; with
	// no sleeper left, w wakes anyway.
	vram.setReads(vram.used(total, 0))
	use(t, s, cfg, "w")
	st = check("wake of w", nil, 2)
	if !readyWith("w")(st) || st.Engine.PID != pids["w"] {
		t.Fatalf("pool: %+v, want w woken on pid %d", st, pids["w"])
	}
	waitGroupGoneT(t, pids["z"], "z, evicted")

	obs.mu.Lock()
	exits := slices.Clone(obs.exits)
	obs.mu.Unlock()
	for _, want := range []string{"x:stopped", "y:stopped", "z:stopped"} {
		if !slices.Contains(exits, want) {
			t.Errorf("engine exits %v, want %s", exits, want)
		}
	}
}

func TestGPUShortfall(t *testing.T) {
	const g = 1 << 30
	gpu := func(index int, used uint64, procs ...statusapi.GPUProcess) statusapi.GPU {
		return statusapi.GPU{Index: index, MemoryUsedBytes: used, MemoryTotalBytes: 80 * g, Processes: procs}
	}
	for _, tt := range []struct {
		name string
		devs []statusapi.GPU
		util float64
		own  []int
		want string
	}{
		{"empty gpus", []statusapi.GPU{gpu(0, 0), gpu(1, 0)}, 0.9, nil, ""},
		{"exactly enough", []statusapi.GPU{gpu(0, 8*g)}, 0.9, nil, ""},
		{"a sleeper's residue", []statusapi.GPU{gpu(0, 9*g)}, 0.9, nil, "gpu 0: 71.00 GiB free, 72.00 GiB needed"},
		{"a lower utilization fits", []statusapi.GPU{gpu(0, 9*g)}, 0.5, nil, ""},
		{"one gpu of two", []statusapi.GPU{gpu(0, 0), gpu(1, 40*g)}, 0.6, nil, "gpu 1: 40.00 GiB free, 48.00 GiB needed"},
		{"both", []statusapi.GPU{gpu(2, 79*g), gpu(3, 80*g)}, 0.9, nil, "gpu 2: 1.00 GiB free, 72.00 GiB needed; gpu 3: 0.00 GiB free, 72.00 GiB needed"},
		{"what a waking sleeper holds counts", []statusapi.GPU{gpu(0, 10*g, statusapi.GPUProcess{PID: 7, UsedBytes: 2 * g})}, 0.9, []int{7}, ""},
		{"only its own", []statusapi.GPU{gpu(0, 10*g, statusapi.GPUProcess{PID: 8, UsedBytes: 2 * g})}, 0.9, []int{7}, "gpu 0: 70.00 GiB free, 72.00 GiB needed"},
		{"more held than needed", []statusapi.GPU{gpu(0, 80*g, statusapi.GPUProcess{PID: 7, UsedBytes: 80 * g})}, 0.9, []int{7}, ""},
		{"used over total", []statusapi.GPU{gpu(0, 90*g)}, 0.1, nil, "gpu 0: 0.00 GiB free, 8.00 GiB needed"},
	} {
		if got := gpuShortfall(tt.devs, tt.util, tt.own); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
