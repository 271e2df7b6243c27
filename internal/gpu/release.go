package gpu

import (
	"fmt"
	"slices"
	"time"
)

// DefaultReleaseTimeout bounds the wait for a stopped engine's GPU memory.
const DefaultReleaseTimeout = 30 * time.Second

// Releaser checks, after an engine's process group is gone, that the pool's
// GPUs released its memory (the stop step of the swap contract,
// docs/design.md), checks the same after an engine is put to sleep, and
// reads the GPUs before an engine starts. It implements pool.VRAM; with the
// Unavailable provider every read fails with ErrUnavailable. A zero Timeout
// means DefaultReleaseTimeout.
type Releaser struct {
	Provider Provider
	Timeout  time.Duration
}

// Watch snapshots, just before an engine is stopped, what pids (the live members
// of its process group) hold on the GPUs with the given indexes. The returned
// function, called once the group is gone, polls until none of those pids is
// listed on those GPUs any more and each GPU's used memory has dropped by at
// least half of what they held, or the timeout passes; it then returns a
// *NotReleasedError naming every pid still listed there. An engine that held
// nothing NVML could see is released as soon as its pids are gone.
func (r *Releaser) Watch(gpus []int, pids []int) func() error {
	return r.watch(gpus, pids, true)
}

// WatchSleep is Watch for an engine put to sleep, whose processes stay listed:
// the returned function, called once the engine sleeps, polls until each GPU's
// used memory has dropped by at least half of what pids held, or the timeout
// passes. An engine that held nothing NVML could see passes at once.
func (r *Releaser) WatchSleep(gpus []int, pids []int) func() error {
	return r.watch(gpus, pids, false)
}

// watch implements Watch and, with gone false (the pids need not leave the
// GPUs), WatchSleep.
func (r *Releaser) watch(gpus []int, pids []int, gone bool) func() error {
	devs, err := r.Provider.Devices()
	if err != nil {
		return func() error { return fmt.Errorf("reading gpus before the stop or sleep: %w", err) }
	}
	type before struct{ used, held uint64 }
	was := make(map[int]before)
	var engine []int
	for _, d := range Select(devs, gpus) {
		b := before{used: d.MemoryUsedBytes}
		for _, p := range d.Processes {
			if slices.Contains(pids, p.PID) {
				b.held += p.UsedBytes
				engine = append(engine, p.PID)
			}
		}
		was[d.Index] = b
	}
	return func() error {
		timeout := r.Timeout
		if timeout <= 0 {
			timeout = DefaultReleaseTimeout
		}
		deadline := time.Now().Add(timeout)
		interval := 5 * time.Millisecond
		for {
			devs, err := r.Provider.Devices()
			if err != nil {
				return fmt.Errorf("reading gpus after the stop or sleep: %w", err)
			}
			holders := make(map[int][]int)
			for _, d := range Select(devs, gpus) {
				b := was[d.Index]
				listed := gone && slices.ContainsFunc(d.Processes, func(p Process) bool { return slices.Contains(engine, p.PID) })
				if listed || (b.held > 0 && d.MemoryUsedBytes+b.held/2 > b.used) {
					holders[d.Index] = pidsOf(d.Processes)
				}
			}
			if len(holders) == 0 {
				return nil
			}
			if !time.Now().Before(deadline) {
				return &NotReleasedError{Holders: holders, Engine: engine, Waited: timeout.String()}
			}
			time.Sleep(interval)
			interval = min(interval*2, 250*time.Millisecond)
		}
	}
}

// GPUs reads the GPUs with the given indexes (memory and compute processes),
// in that order, leaving out those no device has; it fails when none of them
// can be read. The devices may be shared: callers must not modify them.
func (r *Releaser) GPUs(indexes []int) ([]Device, error) {
	devs, err := r.Provider.Devices()
	if err != nil {
		return nil, fmt.Errorf("reading gpus: %w", err)
	}
	sel := Select(devs, indexes)
	if len(sel) == 0 {
		return nil, fmt.Errorf("reading gpus: none of %v found", indexes)
	}
	return sel, nil
}

func pidsOf(ps []Process) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.PID
	}
	return out
}
