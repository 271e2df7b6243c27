package pool

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// fakeVRAM records what the pool asked it to watch and answers with err; its
// sleep check answers with sleepErr. GPUs serves scripted readings
// (setReads), each GPU of total bytes, all free while none is scripted.
type fakeVRAM struct {
	err, sleepErr error
	total         uint64

	mu          sync.Mutex // guards every field below
	gpus        []int
	watched     [][]int // the gpus of every Watch, in order
	pids        []int
	waited      bool
	sleepGPUs   []int
	sleepPIDs   []int
	sleepWaited int
	reads       [][]statusapi.GPU // the next readings; the last one is served forever after
	readCalls   int               // GPUs calls since the last setReads
}

func (f *fakeVRAM) Watch(gpus, pids []int) func() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gpus, f.pids = gpus, pids
	f.watched = append(f.watched, gpus)
	return func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.waited = true
		return f.err
	}
}

func (f *fakeVRAM) WatchSleep(gpus, pids []int) func() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sleepGPUs, f.sleepPIDs = gpus, pids
	return func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.sleepWaited++
		return f.sleepErr
	}
}

func (f *fakeVRAM) GPUs(gpus []int) ([]statusapi.GPU, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readCalls++
	if len(f.reads) == 0 {
		devs := make([]statusapi.GPU, len(gpus))
		for i, g := range gpus {
			devs[i] = statusapi.GPU{Index: g, MemoryTotalBytes: f.total}
		}
		return devs, nil
	}
	devs := f.reads[0]
	if len(f.reads) > 1 {
		f.reads = f.reads[1:]
	}
	return devs, nil
}

// used is one reading: GPU i (from 0) has used[i] bytes used of f.total.
func (f *fakeVRAM) used(used ...uint64) []statusapi.GPU {
	devs := make([]statusapi.GPU, len(used))
	for i, u := range used {
		devs[i] = statusapi.GPU{Index: i, MemoryUsedBytes: u, MemoryTotalBytes: f.total}
	}
	return devs
}

// setReads scripts the next GPUs readings and resets the call count.
func (f *fakeVRAM) setReads(reads ...[]statusapi.GPU) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads, f.readCalls = reads, 0
}

// exitObserver counts the observer calls the stop makes.
type exitObserver struct {
	mu          sync.Mutex // guards the fields below
	exits       []string
	notReleased int
	sleepHeld   int      // SleepVRAMNotReleased calls
	releases    []string // IdleRelease calls, profile:action
	dropped     []string // EngineLogDropped calls, pool:reason
	selfSlept   []string // EngineSelfSlept calls' actions
}

func (o *exitObserver) Swap(string, string, string, string, string, map[string]time.Duration) {}

func (o *exitObserver) EngineExit(_, profile, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.exits = append(o.exits, profile+":"+reason)
}

func (o *exitObserver) VRAMNotReleased(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.notReleased++
}

func (o *exitObserver) IdleRelease(_, profile, action string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.releases = append(o.releases, profile+":"+action)
}

func (o *exitObserver) EngineLogDropped(pool, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropped = append(o.dropped, pool+":"+reason)
}

func (o *exitObserver) EngineSelfSlept(_, action string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.selfSlept = append(o.selfSlept, action)
}

func (o *exitObserver) SleepVRAMNotReleased(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sleepHeld++
}

// startSleeper starts a real engine process (a shell that sleeps, with a child
// in its group) on a pool with GPUs 2 and 3, without waiting for readiness.
func startSleeper(t *testing.T, opts Options) (*Pool, *engine) {
	t.Helper()
	cfg, err := profile.Parse([]byte(`{
	  "pools": [{"name": "g", "gpus": [2, 3]}],
	  "profiles": [{"id": "s", "model": "m", "command": ["sh", "-c", "sleep 60 & wait # {port}"], "stopTimeout": "5s"}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	p := newPool(cfg.Pool("g"), cfg, opts)
	e, err := startEngine(engineStart{Profile: cfg.Lookup("s"), Spec: cfg.Pool("g"), Supervisor: p.supervisor(), HTTP: p.http, Output: p.outputLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.stop(0, p.log) })
	return p, e
}

func TestStopWaitsForVRAMRelease(t *testing.T) {
	vram := &fakeVRAM{}
	obs := &exitObserver{}
	p, e := startSleeper(t, Options{VRAM: vram, Observer: obs})
	// Wait (bounded) for the shell's sleeping child so that the group has two members.
	deadline := time.Now().Add(10 * time.Second)
	for len(groupMembers(e.h.PID())) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	members := groupMembers(e.h.PID())
	if len(members) < 2 {
		t.Fatalf("engine group has members %v, want the shell and its child", members)
	}
	release, err := p.stopEngine(e)
	if err != nil {
		t.Fatal(err)
	}
	if release <= 0 {
		t.Fatalf("release duration %v, want > 0", release)
	}
	if !vram.waited || !slices.Equal(vram.gpus, []int{2, 3}) || !slices.Contains(vram.pids, e.h.PID()) || len(vram.pids) != len(members) {
		t.Fatalf("watched gpus %v pids %v (waited %t), want gpus [2 3] and pids %v", vram.gpus, vram.pids, vram.waited, members)
	}
	if left := groupMembers(e.h.PID()); len(left) != 0 {
		t.Fatalf("group members left: %v", left)
	}
	if obs.notReleased != 0 || !slices.Equal(obs.exits, []string{"s:stopped"}) {
		t.Fatalf("observer: exits %v, not released %d", obs.exits, obs.notReleased)
	}
}

func TestVRAMNotReleasedIsReportedNotFatal(t *testing.T) {
	vram := &fakeVRAM{err: errors.New("gpu 2 lists pids [77] (foreign [77])")}
	obs := &exitObserver{}
	p, e := startSleeper(t, Options{VRAM: vram, Observer: obs})
	release, err := p.stopEngine(e)
	if err != nil {
		t.Fatalf("stop failed although the group is gone: %v", err)
	}
	if release != 0 {
		t.Fatalf("release duration %v reported for a check that gave up", release)
	}
	if obs.notReleased != 1 {
		t.Fatalf("VRAMNotReleased called %d times, want 1", obs.notReleased)
	}
}

func TestStopWithoutVRAMCheck(t *testing.T) {
	p, e := startSleeper(t, Options{})
	release, err := p.stopEngine(e)
	if err != nil || release != 0 {
		t.Fatalf("stop: release %v, err %v; want 0, nil", release, err)
	}
}
