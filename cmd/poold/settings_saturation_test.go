package main

import (
	"strings"
	"testing"
	"time"
)

// TestEngineMetricsSettings: engines are scraped every second by default,
// each scrape bounded; the interval comes from any source, 0 turns the
// scrapes off, and a negative interval or a zero timeout is refused.
func TestEngineMetricsSettings(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil {
		t.Fatal(err)
	}
	if s.EngineMetricsInterval != time.Second || s.EngineMetricsTimeout != 2*time.Second {
		t.Errorf("defaults: interval %v, timeout %v; want 1s and 2s", s.EngineMetricsInterval, s.EngineMetricsTimeout)
	}
	t.Setenv("POOLD_ENGINE_METRICS_INTERVAL", "0")
	t.Setenv("POOLD_CONFIG", writeYAML(t, "engine-metrics-timeout: 500ms\n"))
	if s, err = loadSettings([]string{"--profiles", "p.json"}); err != nil {
		t.Fatal(err)
	}
	if s.EngineMetricsInterval != 0 || s.EngineMetricsTimeout != 500*time.Millisecond {
		t.Errorf("interval %v, timeout %v; want 0 (env) and 500ms (file)", s.EngineMetricsInterval, s.EngineMetricsTimeout)
	}
	for _, args := range [][]string{{"--engine-metrics-interval", "-1s"}, {"--engine-metrics-timeout", "0"}} {
		_, err := loadSettings(append([]string{"--profiles", "p.json"}, args...))
		if name := strings.TrimPrefix(args[0], "--"); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: err = %v, want one naming %s", args, err, name)
		}
	}
}
