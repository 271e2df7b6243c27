package main

import (
	"slices"
	"testing"
)

// vllm-command is a setting as any other: a flag, POOLD_VLLM_COMMAND, a key
// of the settings file, or "vllm serve"; split on spaces. One of no word
// stops poold.
func TestVLLMCommandSetting(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	t.Setenv("POOLD_VLLM_COMMAND", "")
	python := []string{"/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"}
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil || !slices.Equal(s.VLLMCommand, []string{"vllm", "serve"}) {
		t.Fatalf("default vllm-command %q, %v; want vllm serve", s.VLLMCommand, err)
	}
	s, err = loadSettings([]string{"--profiles", "p.json", "--vllm-command", "  /opt/vllm/bin/python -m\tvllm.entrypoints.openai.api_server "})
	if err != nil || !slices.Equal(s.VLLMCommand, python) {
		t.Fatalf("--vllm-command: %q, %v; want %q", s.VLLMCommand, err, python)
	}
	t.Setenv("POOLD_CONFIG", writeYAML(t, "vllm-command: /opt/vllm/bin/python -m vllm.entrypoints.openai.api_server\n"))
	if s, err = loadSettings([]string{"--profiles", "p.json"}); err != nil || !slices.Equal(s.VLLMCommand, python) {
		t.Fatalf("from the settings file: %q, %v; want %q", s.VLLMCommand, err, python)
	}
	t.Setenv("POOLD_VLLM_COMMAND", "/srv/vllm serve")
	if s, err = loadSettings([]string{"--profiles", "p.json"}); err != nil || !slices.Equal(s.VLLMCommand, []string{"/srv/vllm", "serve"}) {
		t.Fatalf("POOLD_VLLM_COMMAND over the settings file: %q, %v", s.VLLMCommand, err)
	}
	for _, empty := range []string{"", " \t "} {
		if _, err := loadSettings([]string{"--profiles", "p.json", "--vllm-command", empty}); err == nil || err.Error() != errVLLMCommandEmpty.Error() {
			t.Errorf("vllm-command %q: %v; want %v", empty, err, errVLLMCommandEmpty)
		}
	}
	t.Setenv("POOLD_VLLM_COMMAND", "")
	t.Setenv("POOLD_CONFIG", writeYAML(t, "vllm-command: \"\"\n"))
	if _, err := loadSettings([]string{"--profiles", "p.json"}); err == nil || err.Error() != errVLLMCommandEmpty.Error() {
		t.Errorf("an empty vllm-command in the settings file: %v; want %v", err, errVLLMCommandEmpty)
	}
}
