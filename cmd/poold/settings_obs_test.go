package main

import (
	"net/http"
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

func TestClientClassesFromSettingsFile(t *testing.T) {
	path := writeYAML(t, "access-log: /var/log/poold/access.log\nclients:\n  header: X-Client\n  classes:\n    team-a:\n      keys: [sk-a]\n    batch: {}\n")
	s, err := loadSettings([]string{"--profiles", "p.json", "--config", path})
	if err != nil {
		t.Fatal(err)
	}
	if s.AccessLog != "/var/log/poold/access.log" {
		t.Errorf("access-log %q", s.AccessLog)
	}
	for _, tc := range []struct{ header, value, want string }{
		{"Authorization", "Bearer sk-a", "team-a"},
		{"X-Client", "batch", "batch"},
		{"X-Other", "batch", "other"},
	} {
		if got := s.Clients.Classify(http.Header{tc.header: {tc.value}}); got != tc.want {
			t.Errorf("%s: %s → %q, want %q", tc.header, tc.value, got, tc.want)
		}
	}
}

func TestBadClientClassesRefuseToStart(t *testing.T) {
	path := writeYAML(t, "clients:\n  classes:\n    other:\n      keys: [sk-secret-1]\n")
	_, err := loadSettings([]string{"--profiles", "p.json", "--config", path})
	if err == nil || !strings.Contains(err.Error(), "clients.classes.other") || strings.Contains(err.Error(), "sk-secret-1") {
		t.Fatalf("err = %v; want one naming clients.classes.other without the key", err)
	}
}

func TestAccessLogDefaultsToStdout(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil {
		t.Fatal(err)
	}
	if s.AccessLog != "stdout" || s.Clients != nil {
		t.Fatalf("access-log %q, clients %v; want stdout and none", s.AccessLog, s.Clients)
	}
}

// TestSizesTakeUnits: byte sizes take a unit in every source.
func TestSizesTakeUnits(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "max-header-bytes: 64KiB\n"))
	t.Setenv("POOLD_MAX_BODY_BYTES", "32MiB")
	s, err := loadSettings([]string{"--profiles", "p.json"})
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxBodyBytes != 32<<20 || s.MaxHeaderBytes != 64<<10 {
		t.Fatalf("max-body-bytes %d, max-header-bytes %d; want 32MiB and 64KiB", s.MaxBodyBytes, s.MaxHeaderBytes)
	}
}
