package main

import (
	"strings"
	"testing"
)

func TestContainmentSetting(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil || s.Containment != "auto" {
		t.Fatalf("default containment %q, %v; want auto", s.Containment, err)
	}
	t.Setenv("POOLD_CONTAINMENT", "process-group")
	if s, err = loadSettings([]string{"--profiles", "p.json"}); err != nil || s.Containment != "process-group" {
		t.Fatalf("POOLD_CONTAINMENT: %q, %v", s.Containment, err)
	}
	if _, err := loadSettings([]string{"--profiles", "p.json", "--containment", "jail"}); err == nil || !strings.Contains(err.Error(), `containment: "jail"`) {
		t.Fatalf("a bad containment: %v", err)
	}
}
