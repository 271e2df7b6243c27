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
	return m.update(func(local int, u simgpu.Usage, _ uint64) (uint64, error) {
		need := m.full(u.TotalBytes)
		if u.FreeBytes() < need {
			return 0, &vllmError{ErrGPUMemory, fmt.Sprintf("ValueError: Free memory on device cuda:%d (%.2f/%.2f GiB) on startup is less than desired GPU memory utilization (%g, %.2f GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
				local, gibs(u.FreeBytes()), gibs(u.TotalBytes), m.util, gibs(need))}
		}
		return need, nil
	})
}

// set claims what the engine holds with the weights and the KV cache awake
// or not. Shrinking always succeeds; growing fails as torch's out-of-memory
// error when a GPU lacks the room.
func (m *gpuMemory) set(weights, kv bool) error {
	return m.update(func(local int, u simgpu.Usage, mine uint64) (uint64, error) {
		want := m.want(u.TotalBytes, weights, kv)
		if want > mine && want-mine > u.FreeBytes() {
			//lint:ignore ST1005 vLLM's own message, word for word
			return 0, fmt.Errorf("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity of %.2f GiB of which %.2f GiB is free.",
				gibs(want-mine), local, gibs(u.TotalBytes), gibs(u.FreeBytes()))
		}
		return want, nil
	})
}

// update sets the claim on each of the engine's GPUs to what claim returns
// for it, given its local index (cuda:N), its usage and what the engine holds
// on it now; the first error leaves the claim as it was.
func (m *gpuMemory) update(claim func(local int, u simgpu.Usage, mine uint64) (uint64, error)) error {
	return m.dir.Update(m.pid, func(use []simgpu.Usage) (map[int]uint64, error) {
		want := make(map[int]uint64)
		for local, idx := range m.devices {
			i := slices.IndexFunc(use, func(u simgpu.Usage) bool { return u.Index == idx })
			if i < 0 {
				return nil, fmt.Errorf("RuntimeError: CUDA error: invalid device ordinal (no simulated gpu %d in %s)", idx, m.dir.Path())
			}
			var mine uint64
			if j := slices.IndexFunc(use[i].Holders, func(h simgpu.Holder) bool { return h.PID == m.pid }); j >= 0 {
				mine = use[i].Holders[j].Bytes
			}
			n, err := claim(local, use[i], mine)
			if err != nil {
				return nil, err
			}
			want[idx] = n
		}
		return want, nil
	})
}

// release drops the claim.
func (m *gpuMemory) release() error { return m.dir.Release(m.pid) }

func gibs(n uint64) float64 { return float64(n) / gib }
