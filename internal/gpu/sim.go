package gpu

import (
	"fmt"

	"github.com/poold/poold/internal/simgpu"
)

// SimProvider is a Provider backed by a simulated-GPU directory (package
// simgpu), which simulated engines (`poold engine-sim --sim-gpu-dir`) claim
// memory in: each GPU's used memory is the sum of the live claims, and each
// claiming process is one of its compute processes. Utilisation,
// temperature and power read as zero. It is safe for concurrent use.
type SimProvider struct {
	dir *simgpu.Dir
}

// OpenSim returns the provider for the simulated-GPU directory at path.
func OpenSim(path string) (*SimProvider, error) {
	d, err := simgpu.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening simulated gpus: %w", err)
	}
	return &SimProvider{dir: d}, nil
}

// Available implements Provider: the directory must still be readable.
func (p *SimProvider) Available() (bool, string) {
	if _, err := p.dir.Snapshot(); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// Devices implements Provider.
func (p *SimProvider) Devices() ([]Device, error) {
	use, err := p.dir.Snapshot()
	if err != nil {
		return nil, err
	}
	devs := make([]Device, len(use))
	for i, u := range use {
		d := Device{
			Index:            u.Index,
			UUID:             fmt.Sprintf("GPU-sim-%d", u.Index),
			Name:             "Simulated GPU",
			MemoryUsedBytes:  u.UsedBytes,
			MemoryTotalBytes: u.TotalBytes,
			Processes:        make([]Process, len(u.Holders)),
		}
		for j, h := range u.Holders {
			d.Processes[j] = Process{PID: h.PID, UsedBytes: h.Bytes}
		}
		devs[i] = d
	}
	return devs, nil
}
