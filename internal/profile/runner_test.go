package profile

import "testing"

func TestRunner(t *testing.T) {
	for _, tt := range []struct {
		name          string
		args, command []string
		want          string
	}{
		{"unset: the engine decides", nil, nil, ""},
		{"auto", []string{"--runner", "auto"}, nil, ""},
		{"pooling", []string{"--runner", "pooling"}, nil, RunnerPooling},
		{"generate, inline", []string{"--runner=generate"}, nil, RunnerGenerate},
		{"the last wins", []string{"--runner", "pooling", "--runner", "generate"}, nil, RunnerGenerate},
		{"convert embed", []string{"--convert", "embed"}, nil, RunnerPooling},
		{"convert none", []string{"--convert", "none"}, nil, ""},
		{"runner over convert", []string{"--runner", "generate", "--convert", "embed"}, nil, RunnerGenerate},
		{"an older task", []string{"--task", "embed"}, nil, RunnerPooling},
		{"an older task, underscores", []string{"--task=score"}, nil, RunnerPooling},
		{"an older generate task", []string{"--task", "generate"}, nil, RunnerGenerate},
		{"in the command", []string{"--runner", "generate"}, []string{"{poold}", "engine-sim", "--runner", "pooling"}, RunnerPooling},
		{"a command without it", []string{"--runner", "pooling"}, []string{"{poold}", "engine-sim"}, ""},
		{"draft", []string{"--runner", "draft"}, nil, ""},
	} {
		p := &Profile{Args: tt.args, Command: tt.command}
		if got := p.Runner(); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
