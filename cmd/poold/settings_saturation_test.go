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

// TestReadySettings: /ready's thresholds default to 10 waiting and 95% of
// the KV cache, come from any source, and must make sense.
func TestReadySettings(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil {
		t.Fatal(err)
	}
	if s.ReadyMaxEngineWaiting != 10 || s.ReadyMaxKVCacheUsage != 0.95 {
		t.Errorf("defaults: %d waiting, %v KV; want 10 and 0.95", s.ReadyMaxEngineWaiting, s.ReadyMaxKVCacheUsage)
	}
	t.Setenv("POOLD_READY_MAX_ENGINE_WAITING", "4")
	t.Setenv("POOLD_CONFIG", writeYAML(t, "ready-max-kv-cache-usage: 0.9\n"))
	if s, err = loadSettings([]string{"--profiles", "p.json"}); err != nil {
		t.Fatal(err)
	}
	if s.ReadyMaxEngineWaiting != 4 || s.ReadyMaxKVCacheUsage != 0.9 {
		t.Errorf("%d waiting, %v KV; want 4 (env) and 0.9 (file)", s.ReadyMaxEngineWaiting, s.ReadyMaxKVCacheUsage)
	}
	for _, args := range [][]string{{"--ready-max-engine-waiting", "0"}, {"--ready-max-kv-cache-usage", "1.5"}, {"--ready-max-kv-cache-usage", "0"}} {
		_, err := loadSettings(append([]string{"--profiles", "p.json"}, args...))
		if name := strings.TrimPrefix(args[0], "--"); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: err = %v, want one naming %s", args, err, name)
		}
	}
	t.Setenv("POOLD_READY_MAX_KV_CACHE_USAGE", "lots")
	if _, err := loadSettings([]string{"--profiles", "p.json"}); err == nil || !strings.Contains(err.Error(), "invalid number") {
		t.Errorf("a KV threshold that is not a number: err = %v", err)
	}
}
