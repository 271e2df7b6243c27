package pool

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
)

func openLedger(t *testing.T, dir string) *proc.Ledger {
	t.Helper()
	l, err := proc.OpenLedger(dir, nil, proc.StopOrphan, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A stopped engine is forgotten: the ledger records none after its stop.
func TestLedgerForgetsStoppedEngines(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir)
	p, e := startSleeper(t, Options{Ledger: l})
	l.Add(e.record("g"))
	if f := readRecords(t, dir); len(f.Engines) != 1 {
		t.Fatalf("engines file after the start: %+v, want the engine", f)
	}
	if _, err := p.stopEngine(e); err != nil {
		t.Fatal(err)
	}
	if f := readRecords(t, dir); len(f.Engines) != 0 {
		t.Fatalf("engines file after a stop: %+v, want none", f)
	}
}

// enginesFile is engines.json as the ledger writes it.
type enginesFile struct {
	BootID  string              `json:"bootId"`
	Engines []proc.LedgerEngine `json:"engines"`
}

// readRecords reads the engines file of dir.
func readRecords(t *testing.T, dir string) enginesFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "engines.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f enginesFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// writeRecords writes an engines file of this boot recording engines, as a
// previous poold would have.
func writeRecords(t *testing.T, dir string, engines ...proc.LedgerEngine) {
	t.Helper()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skipf("no boot id: %v", err)
	}
	data, err := json.Marshal(enginesFile{BootID: strings.TrimSpace(string(boot)), Engines: engines})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "engines.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// nobody is the uid (and gid) of the tests' processes of another user.
const nobody = 65534

// needRoot skips a test that must create files or processes of another
// user.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to create files and processes of another user (uid 65534)")
	}
}

// exitedPID is the pid of a process that has exited.
func exitedPID(t *testing.T) int {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func realTempDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
