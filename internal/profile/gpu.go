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
	if f, err := strconv.ParseFloat(p.engineArg("--gpu-memory-utilization"), 64); err == nil && f > 0 && f <= 1 {
		return f
	}
	return DefaultGPUMemoryUtilization
}

// Ceiling is the admission ceiling of p's engine: MaxInFlight when set,
// else the engine's --max-num-seqs when its arguments set it to a positive
// number (vLLM runs at most that many sequences at once and queues the
// rest in its own, first-come queue), else zero: none.
func (p *Profile) Ceiling() int {
	if p.MaxInFlight > 0 {
		return p.MaxInFlight
	}
	if n, err := strconv.Atoi(p.engineArg("--max-num-seqs")); err == nil && n > 0 {
		return n
	}
	return 0
}

// engineArg is the value of the engine option name (written with dashes)
// in p's arguments (Command's when it has one, else Args), as argparse
// reads them: "--name value" or "--name=value", underscores for dashes,
// the last one given winning; "" when absent.
func (p *Profile) engineArg(name string) string {
	args := p.Args
	if p.Command != nil {
		args = p.Command
	}
	value := ""
	for i, a := range args {
		n, v, inline := strings.Cut(a, "=")
		if strings.ReplaceAll(n, "_", "-") != name {
			continue
		}
		if !inline {
			if i+1 == len(args) {
				continue
			}
			v = args[i+1]
		}
		value = v
	}
	return value
}
