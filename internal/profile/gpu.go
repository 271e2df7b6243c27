package profile

import (
	"strconv"
	"strings"
)

// DefaultGPUMemoryUtilization is vLLM's --gpu-memory-utilization when a
// profile does not set it.
const DefaultGPUMemoryUtilization = 0.9

// GPUMemoryUtilization is the share of each GPU's memory that p's engine
// claims: the value of --gpu-memory-utilization in its arguments (Command's
// when it has one, else Args; the last one given wins, as argparse does),
// else DefaultGPUMemoryUtilization, also when the value is not a number in
// (0, 1], which vLLM refuses anyway. vLLM starts only where each GPU has at
// least that share of its memory free.
func (p *Profile) GPUMemoryUtilization() float64 {
	args := p.Args
	if p.Command != nil {
		args = p.Command
	}
	util := DefaultGPUMemoryUtilization
	for i, a := range args {
		name, value, inline := strings.Cut(a, "=")
		if strings.ReplaceAll(name, "_", "-") != "--gpu-memory-utilization" {
			continue
		}
		if !inline {
			if i+1 == len(args) {
				continue
			}
			value = args[i+1]
		}
		if f, err := strconv.ParseFloat(value, 64); err == nil && f > 0 && f <= 1 {
			util = f
		}
	}
	return util
}
