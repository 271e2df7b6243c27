package engine

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

func openLedger(t *testing.T, dir string) *Ledger {
	t.Helper()
	l, err := OpenLedger(dir, nil, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func readLedger(t *testing.T, dir string) ledgerFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "engines.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f ledgerFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestLedgerReapsWhatACrashLeft records a real engine (a shell with a
// sleeping child), kills its leader as Pdeathsig does when poold dies,
// and checks that the next ledger on the directory stops the orphaned child.
func TestLedgerReapsWhatACrashLeft(t *testing.T) {
	dir, pids := t.TempDir(), t.TempDir()
	first := openLedger(t, dir)
	e := startEngine(t, nil, "sleep 60 & echo $! > "+pids+"/c; wait")
	child := readPIDs(t, pids, "c")[0]
	first.Add(e.record())
	f := readLedger(t, dir)
	if len(f.Engines) != 1 || f.Engines[0].PGID != e.pid || f.Engines[0].Token == "" || f.Engines[0].StartTicks == 0 {
		t.Fatalf("engines file: %+v", f)
	}
	// An unrelated process in a group of its own is never touched, even when
	// a (forged) record names its group.
	bystander := exec.Command("sleep", "60")
	bystander.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bystander.Process.Kill(); _ = bystander.Wait() })
	first.Add(LedgerEngine{Pool: "g", Profile: "other", PID: bystander.Process.Pid, PGID: bystander.Process.Pid, Token: "not-its-token"})

	// The crash: the daemon's lock goes with it, and its engine's leader dies.
	first.Close()
	_ = syscall.Kill(e.pid, syscall.SIGKILL)
	<-e.exited
	if !alive(child) {
		t.Fatal("the child died with its leader; nothing left to reap")
	}

	second := openLedger(t, dir)
	reaped, err := second.Reap(100 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reaped, []int{child}) {
		t.Fatalf("reaped %v, want the child %d", reaped, child)
	}
	if alive(child) {
		t.Fatalf("leftover child %d still runs", child)
	}
	if !alive(bystander.Process.Pid) {
		t.Fatal("Reap killed an unrelated process")
	}
	if f := readLedger(t, dir); len(f.Engines) != 0 {
		t.Fatalf("engines file after Reap: %+v, want none", f)
	}
}

func TestLedgerLocksItsDirectory(t *testing.T) {
	dir := t.TempDir()
	openLedger(t, dir)
	if l, err := OpenLedger(dir, nil, nil, slog.New(slog.DiscardHandler)); err == nil {
		l.Close()
		t.Fatal("a second ledger opened the same directory")
	}
}

// A recorded engine put to sleep is recorded so, and one removed is
// forgotten, with its shim's files.
func TestLedgerRecordsSleepAndRemoval(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir)
	sock := filepath.Join(dir, "engine-x.sock")
	for _, p := range []string{sock, sock + ".log"} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l.Add(LedgerEngine{Pool: "g", Profile: "s", PID: 42, PGID: 42, Shim: sock})
	l.Asleep(42, 1)
	l.Asleep(43, 2) // not recorded: no record is made
	if f := readLedger(t, dir); len(f.Engines) != 1 || f.Engines[0].Sleeping != 1 {
		t.Fatalf("engines file after Asleep: %+v, want the engine asleep at level 1", f)
	}
	l.Remove(42, sock)
	if f := readLedger(t, dir); len(f.Engines) != 0 {
		t.Fatalf("engines file after Remove: %+v, want none", f)
	}
	for _, p := range []string{sock, sock + ".log"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after Remove: %v", p, err)
		}
	}
}
