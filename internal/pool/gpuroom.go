package pool

import (
	"fmt"
	"slices"
	"strings"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// gpuShortfall applies vLLM's start-up rule to devs, the pool's GPUs: each
// must have free at least total × util, less what own (the pids of a
// sleeper about to wake, which reclaims its memory) already holds there. It
// returns "" when every GPU has room, else which GPUs lack it and by how much.
func gpuShortfall(devs []statusapi.GPU, util float64, own []int) string {
	var short []string
	for _, d := range devs {
		need := uint64(float64(d.MemoryTotalBytes) * util)
		for _, proc := range d.Processes {
			if slices.Contains(own, proc.PID) {
				need -= min(need, proc.UsedBytes)
			}
		}
		if free := d.MemoryTotalBytes - min(d.MemoryUsedBytes, d.MemoryTotalBytes); free < need {
			short = append(short, fmt.Sprintf("gpu %d: %s free, %s needed", d.Index, gib(free), gib(need)))
		}
	}
	return strings.Join(short, "; ")
}

func gib(n uint64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

// makeGPURoom runs before the pool starts an engine for prof, or wakes its
// sleeper (whose process group's pids are own). With a VRAM check
// configured, it evicts the pool's sleepers, least recently used first,
// while a GPU of the pool fails vLLM's start-up rule (gpuShortfall) with
// prof's --gpu-memory-utilization. With none left to evict, or the GPUs
// unreadable, the engine starts anyway: vLLM itself refuses a start that
// does not fit, and the swap then evicts once more and starts it again
// (noteMemoryShort).
func (p *Pool) makeGPURoom(prof *profile.Profile, gpus, own []int) {
	if p.opts.VRAM == nil {
		return
	}
	util := prof.GPUMemoryUtilization()
	for {
		devs, err := p.opts.VRAM.GPUs(gpus)
		if err != nil {
			p.log.Warn("reading the GPUs' memory; evicting no sleeper", "profile", prof.ID, "gpus", gpus, "err", err)
			return
		}
		short := gpuShortfall(devs, util, own)
		if short == "" {
			return
		}
		if !p.evictOldest(fmt.Sprintf("gpu memory for %s at --gpu-memory-utilization %g: %s", prof.ID, util, short)) {
			p.log.Warn("too little free GPU memory and no sleeper to evict; starting anyway", "profile", prof.ID, "gpu_memory_utilization", util, "short", short)
			return
		}
	}
}

// memoryShortLine is what vLLM's error says when a GPU has less free memory
// than --gpu-memory-utilization asks for at start-up: "ValueError: Free
// memory on device cuda:0 (…) on startup is less than desired GPU memory
// utilization (…)".
const memoryShortLine = "less than desired gpu memory utilization"
