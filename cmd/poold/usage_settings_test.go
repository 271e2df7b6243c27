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
