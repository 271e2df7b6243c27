package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeYAML(t *testing.T, s string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "poold.yaml")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The client classes of older settings files are refused with where they
// went: the tenants file.
func TestClientClassesPointToTenants(t *testing.T) {
	path := writeYAML(t, "clients:\n  classes:\n    team-a:\n      keys: [sk-secret-1]\n")
	_, err := loadSettings([]string{"--profiles", "p.json", "--config", path})
	if err == nil || !strings.Contains(err.Error(), "tenants file") || strings.Contains(err.Error(), "sk-secret-1") {
		t.Fatalf("err = %v; want one pointing to the tenants file without the key", err)
	}
}

func TestTenantsAndAPIKeysAreExclusive(t *testing.T) {
	_, err := loadSettings([]string{"--profiles", "p.json", "--tenants", "t.json", "--api-keys", "sk-1"})
	if err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Fatalf("err = %v", err)
	}
	s, err := loadSettings([]string{"--profiles", "p.json", "--tenants", "t.json"})
	if err != nil || s.Tenants != "t.json" {
		t.Fatalf("tenants %q, %v", s.Tenants, err)
	}
}

func TestAccessLogDefaultsToStdout(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil {
		t.Fatal(err)
	}
	if s.AccessLog != "stdout" || s.Tenants != "" {
		t.Fatalf("access-log %q, tenants %q; want stdout and none", s.AccessLog, s.Tenants)
	}
}

// TestSizesTakeUnits: byte sizes take a unit in every source.
func TestSizesTakeUnits(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "max-header-bytes: 128KiB\n"))
	t.Setenv("POOLD_MAX_BODY_BYTES", "32MiB")
	s, err := loadSettings([]string{"--profiles", "p.json", "--header-bytes-budget", "8MiB"})
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxBodyBytes != 32<<20 || s.MaxHeaderBytes != 128<<10 || s.HeaderBytesBudget != 8<<20 {
		t.Fatalf("max-body-bytes %d, max-header-bytes %d, header-bytes-budget %d; want 32MiB, 128KiB and 8MiB", s.MaxBodyBytes, s.MaxHeaderBytes, s.HeaderBytesBudget)
	}
}

// TestHeaderBudgetDefaults: the header limits' defaults are sized for real
// clients, and a budget that cannot hold one largest header block is
// refused.
func TestHeaderBudgetDefaults(t *testing.T) {
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxHeaderBytes != 64<<10 || s.HeaderBytesBudget != 32<<20 {
		t.Fatalf("max-header-bytes %d, header-bytes-budget %d; want 64KiB and 32MiB", s.MaxHeaderBytes, s.HeaderBytesBudget)
	}
	_, err = loadSettings([]string{"--profiles", "p.json", "--header-bytes-budget", "32KiB"})
	if err == nil || !strings.Contains(err.Error(), "header-bytes-budget: must hold one largest header block") {
		t.Fatalf("a budget under max-header-bytes: %v", err)
	}
}

// engine-log-polls is off by default, and set like every setting: in the
// settings file, the environment or a flag, the flag first.
func TestEngineLogPolls(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	if s, err := loadSettings([]string{"--profiles", "p.json"}); err != nil || s.EngineLogPolls {
		t.Fatalf("by default engine-log-polls %t, %v; want false", s.EngineLogPolls, err)
	}
	t.Setenv("POOLD_CONFIG", writeYAML(t, "engine-log-polls: true\n"))
	if s, err := loadSettings([]string{"--profiles", "p.json"}); err != nil || !s.EngineLogPolls {
		t.Fatalf("from the file: engine-log-polls %t, %v; want true", s.EngineLogPolls, err)
	}
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	t.Setenv("POOLD_ENGINE_LOG_POLLS", "true")
	if s, err := loadSettings([]string{"--profiles", "p.json"}); err != nil || !s.EngineLogPolls {
		t.Fatalf("from the environment: engine-log-polls %t, %v; want true", s.EngineLogPolls, err)
	}
	if s, err := loadSettings([]string{"--profiles", "p.json", "--engine-log-polls=false"}); err != nil || s.EngineLogPolls {
		t.Fatalf("a flag over the environment: engine-log-polls %t, %v; want false", s.EngineLogPolls, err)
	}
}
