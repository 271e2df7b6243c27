package main

import (
	"strings"
	"testing"
	"time"
)

func TestKeepEnginesSettings(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil || !s.KeepEngines || s.AdoptTimeout != time.Minute {
		t.Fatalf("defaults: keep %v, adopt-timeout %v, %v; want on and 1m", s.KeepEngines, s.AdoptTimeout, err)
	}
	t.Setenv("POOLD_CONFIG", writeYAML(t, "keep-engines-on-restart: false\nadopt-timeout: 5s\n"))
	if s, err = loadSettings([]string{"--profiles", "p.json"}); err != nil || s.KeepEngines || s.AdoptTimeout != 5*time.Second {
		t.Fatalf("from the settings file: keep %v, adopt-timeout %v, %v", s.KeepEngines, s.AdoptTimeout, err)
	}
	if _, err := loadSettings([]string{"--profiles", "p.json", "--adopt-timeout", "0s"}); err == nil || !strings.Contains(err.Error(), "adopt-timeout: must be positive") {
		t.Fatalf("a zero adopt-timeout: %v", err)
	}
}
