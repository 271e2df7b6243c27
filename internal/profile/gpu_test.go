package profile

import "testing"

func TestGPUMemoryUtilization(t *testing.T) {
	for _, tt := range []struct {
		name          string
		args, command []string
		want          float64
	}{
		{"unset", nil, nil, 0.9},
		{"args", []string{"--enable-prefix-caching", "--gpu-memory-utilization", "0.4"}, nil, 0.4},
		{"inline", []string{"--gpu-memory-utilization=0.75"}, nil, 0.75},
		{"underscores", []string{"--gpu_memory_utilization", "0.5"}, nil, 0.5},
		{"the last wins", []string{"--gpu-memory-utilization", "0.5", "--gpu-memory-utilization=0.6"}, nil, 0.6},
		{"command wins over args", []string{"--gpu-memory-utilization", "0.5"}, []string{"{poold}", "engine-sim", "--gpu-memory-utilization", "0.3"}, 0.3},
		{"command without it", []string{"--gpu-memory-utilization", "0.5"}, []string{"{poold}", "engine-sim"}, 0.9},
		{"not a number", []string{"--gpu-memory-utilization", "most"}, nil, 0.9},
		{"out of range", []string{"--gpu-memory-utilization", "1.5"}, nil, 0.9},
		{"no value", []string{"--gpu-memory-utilization"}, nil, 0.9},
		{"another flag", []string{"--gpu-memory-utilization-x", "0.2"}, nil, 0.9},
	} {
		p := &Profile{Args: tt.args, Command: tt.command}
		if got := p.GPUMemoryUtilization(); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestCeiling(t *testing.T) {
	for _, tt := range []struct {
		name          string
		own           int
		args, command []string
		want          int
	}{
		{"none", 0, nil, nil, 0},
		{"maxInFlight", 4, []string{"--max-num-seqs", "64"}, nil, 4},
		{"max-num-seqs", 0, []string{"--max-num-seqs", "64"}, nil, 64},
		{"inline, underscores", 0, []string{"--max_num_seqs=8"}, nil, 8},
		{"in the command", 0, nil, []string{"{poold}", "engine-sim", "--max-num-seqs", "16"}, 16},
		{"not a number", 0, []string{"--max-num-seqs", "many"}, nil, 0},
		{"zero", 0, []string{"--max-num-seqs", "0"}, nil, 0},
	} {
		p := &Profile{MaxInFlight: tt.own, Args: tt.args, Command: tt.command}
		if got := p.Ceiling(); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}
