package main

import (
	"strings"
	"testing"
	"time"
)

func TestUsageSettings(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, `
usage-cost:
  currency: EUR
  split: lease
  gpu-hour: 2.5
  pools: [{name: gpu0, gpu-hour: 4}]
  gpu-models: [{name: "NVIDIA H100 80GB HBM3", gpu-hour: 3}]
  prompt-per-million: 0.1
`))
	t.Setenv("POOLD_USAGE_POSTGRES", "postgres://poold@db.example:5432/usage")
	s, err := loadSettings([]string{"--profiles", "p.json", "--state-dir", "/srv/state", "--usage-retention", "720h"})
	if err != nil {
		t.Fatal(err)
	}
	u := s.Usage
	if !u.On || u.DB != "/srv/state/usage.db" || u.Explicit || u.Retention != 720*time.Hour || u.Postgres == "" {
		t.Errorf("usage settings %+v", u)
	}
	p := u.Prices
	if p.Currency != "EUR" || p.Split != "lease" || p.GPUHour != 2.5 || len(p.Pools) != 1 || p.Pools[0].GPUHour != 4 ||
		len(p.GPUModels) != 1 || p.GPUModels[0].Name != "NVIDIA H100 80GB HBM3" || p.PromptPerMillion != 0.1 {
		t.Errorf("prices %+v", p)
	}
}

func TestBadUsageSettingsRefuseToStart(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "usage-cost:\n  pools: [{name: a, gpu-hour: -1}]\n"))
	_, err := loadSettings([]string{"--profiles", "p.json", "--usage-retention", "0s", "--usage-postgres", "postgres://a:secret@h:notaport/db"})
	if err == nil {
		t.Fatal("bad usage settings accepted")
	}
	for _, want := range []string{"usage-retention: must be positive", "usage-postgres: not a valid PostgreSQL connection string", "pools[0]: gpu-hour must not be negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error %q shows the DSN's password", err)
	}
}

func TestUnknownUsageCostKey(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "usage-cost:\n  gpu_hour: 2\n"))
	if _, err := loadSettings([]string{"--profiles", "p.json"}); err == nil || !strings.Contains(err.Error(), "gpu_hour") {
		t.Errorf("err = %v; want one naming gpu_hour", err)
	}
}

// Prices set by flag or environment override the settings file's
// usage-cost keys; the currency is USD unless one is set.
func TestPricesByFlagAndEnvironment(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "usage-cost:\n  gpu-hour: 2.5\n  prompt-per-million: 0.1\n  completion-per-million: 0.3\n"))
	t.Setenv("POOLD_USAGE_PROMPT_PER_MILLION", "0.2")
	s, err := loadSettings([]string{"--profiles", "p.json", "--usage-gpu-hour", "4"})
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Usage.Prices; p.GPUHour != 4 || p.PromptPerMillion != 0.2 || p.CompletionPerMillion != 0.3 || p.Currency != "USD" {
		t.Errorf("prices %+v, want gpu-hour from the flag, prompt from the environment, completion from the file, USD", p)
	}

	t.Setenv("POOLD_CONFIG", "")
	t.Setenv("POOLD_USAGE_PROMPT_PER_MILLION", "")
	t.Setenv("POOLD_USAGE_CURRENCY", "EUR")
	s, err = loadSettings([]string{"--profiles", "p.json", "--usage-completion-per-million", "1.5"})
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Usage.Prices; !p.Priced() || p.CompletionPerMillion != 1.5 || p.GPUHour != 0 || p.Currency != "EUR" {
		t.Errorf("prices without a settings file %+v", p)
	}
	if _, err := loadSettings([]string{"--profiles", "p.json", "--usage-gpu-hour", "-1"}); err == nil || !strings.Contains(err.Error(), "usage-gpu-hour: must not be negative") {
		t.Errorf("a negative price by flag: %v", err)
	}
}
