package main

import (
	"log/slog"

	"github.com/poold/poold/internal/gpu"
)

// openGPUs returns the GPU telemetry provider: the simulated GPUs in
// s.GPUSimDir when set (for the simulator and the demo), else NVML, or
// Unavailable without it. close releases it.
func openGPUs(s settings, log *slog.Logger) (p gpu.Provider, close func(), err error) {
	if s.GPUSimDir == "" {
		p, close = gpu.Open(log)
		return p, close, nil
	}
	sim, err := gpu.OpenSim(s.GPUSimDir)
	if err != nil {
		return nil, nil, err
	}
	log.Info("GPU telemetry from simulated GPUs", "dir", s.GPUSimDir)
	return sim, func() {}, nil
}
