package enginesim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/poold/poold/internal/simgpu"
)

const gib = 1 << 30

// ErrGPUMemory is returned (wrapped) by Run when a GPU lacks the free memory
// vLLM's start-up check asks for; the message is vLLM's.
var ErrGPUMemory = errors.New("not enough free gpu memory")

// gpuMemory is the engine's claim on simulated GPUs (--sim-gpu-dir). At start
// it applies vLLM's rule: on each of its GPUs, free memory must be at least
// total × --gpu-memory-utilization, which it then claims. Asleep it keeps only
// a residue; of the rest, the simulator counts half as the weights and half as
// the KV cache, which a wake reclaims tag by tag. It is not safe for
// concurrent use: the Server calls it under opMu.
type gpuMemory struct {
	dir     *simgpu.Dir
	pid     int   // the process the claim is recorded under
	devices []int // CUDA_VISIBLE_DEVICES
	util    float64
	residue uint64
}

// full is what the engine holds awake on a GPU of total bytes.
func (m *gpuMemory) full(total uint64) uint64 { return uint64(float64(total) * m.util) }

// want is the claim on a GPU of total bytes with the weights and the KV cache
// awake or not.
func (m *gpuMemory) want(total uint64, weights, kv bool) uint64 {
	full := m.full(total)
	res := min(m.residue, full)
	w := (full - res) / 2
	n := res
	if weights {
		n += w
	}
	if kv {
		n += full - res - w
	}
	return n
}

// start runs vLLM's start-up check and claims total × utilization on every
// GPU; its error is vLLM's ValueError.
func (m *gpuMemory) start() error {
	return m.dir.Update(m.pid, func(use []simgpu.Usage) (map[int]uint64, error) {
		claim := make(map[int]uint64)
		for local, idx := range m.devices {
			u, err := m.gpu(use, idx)
			if err != nil {
				return nil, err
			}
			need := m.full(u.TotalBytes)
			if u.FreeBytes() < need {
				return nil, &vllmError{ErrGPUMemory, fmt.Sprintf("ValueError: Free memory on device cuda:%d (%.2f/%.2f GiB) on startup is less than desired GPU memory utilization (%g, %.2f GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
					local, gibs(u.FreeBytes()), gibs(u.TotalBytes), m.util, gibs(need))}
			}
			claim[idx] = need
		}
		return claim, nil
	})
}

// set claims what the engine holds with the weights and the KV cache awake
// or not. Shrinking always succeeds; growing fails as torch's out-of-memory
// error when a GPU lacks the room.
func (m *gpuMemory) set(weights, kv bool) error {
	return m.dir.Update(m.pid, func(use []simgpu.Usage) (map[int]uint64, error) {
		claim := make(map[int]uint64)
		for local, idx := range m.devices {
			u, err := m.gpu(use, idx)
			if err != nil {
				return nil, err
			}
			var mine uint64
			if i := slices.IndexFunc(u.Holders, func(h simgpu.Holder) bool { return h.PID == m.pid }); i >= 0 {
				mine = u.Holders[i].Bytes
			}
			want := m.want(u.TotalBytes, weights, kv)
			if want > mine && want-mine > u.FreeBytes() {
				return nil, fmt.Errorf("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity of %.2f GiB of which %.2f GiB is free.",
					gibs(want-mine), local, gibs(u.TotalBytes), gibs(u.FreeBytes()))
			}
			claim[idx] = want
		}
		return claim, nil
	})
}

func (m *gpuMemory) gpu(use []simgpu.Usage, idx int) (simgpu.Usage, error) {
	if i := slices.IndexFunc(use, func(u simgpu.Usage) bool { return u.Index == idx }); i >= 0 {
		return use[i], nil
	}
	return simgpu.Usage{}, fmt.Errorf("RuntimeError: CUDA error: invalid device ordinal (no simulated gpu %d in %s)", idx, m.dir.Path())
}

// release drops the claim.
func (m *gpuMemory) release() error { return m.dir.Release(m.pid) }

func gibs(n uint64) float64 { return float64(n) / gib }
