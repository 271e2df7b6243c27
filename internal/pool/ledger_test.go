package pool

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
	l, err := OpenLedger(dir, nil, slog.New(slog.DiscardHandler))
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
	dir := t.TempDir()
	first := openLedger(t, dir)
	p, e := startSleeper(t, Options{Ledger: first})
	p.opts.Ledger.add("g", e)
	f := readLedger(t, dir)
	if len(f.Engines) != 1 || f.Engines[0].PGID != e.pid || f.Engines[0].Token == "" || f.Engines[0].StartTicks == 0 {
		t.Fatalf("engines file: %+v", f)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(groupMembers(e.pid)) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	var child int
	for _, pid := range groupMembers(e.pid) {
		if pid != e.pid {
			child = pid
		}
	}
	if child == 0 {
		t.Fatalf("no child in the engine's group: %v", groupMembers(e.pid))
	}
	// An unrelated process in a group of its own is never touched, even when
	// a (forged) record names its group.
	bystander := exec.Command("sleep", "60")
	bystander.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bystander.Process.Kill(); _ = bystander.Wait() })
	first.mu.Lock()
	first.engines[bystander.Process.Pid] = LedgerEngine{Pool: "g", Profile: "other", PID: bystander.Process.Pid, PGID: bystander.Process.Pid, Token: "not-its-token"}
	if err := first.writeLocked(); err != nil {
		t.Fatal(err)
	}
	first.mu.Unlock()

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
	if l, err := OpenLedger(dir, nil, slog.New(slog.DiscardHandler)); err == nil {
		l.Close()
		t.Fatal("a second ledger opened the same directory")
	}
}

func TestLedgerForgetsStoppedEngines(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir)
	p, e := startSleeper(t, Options{Ledger: l})
	l.add("g", e)
	if _, err := p.stopEngine(e); err != nil {
		t.Fatal(err)
	}
	if f := readLedger(t, dir); len(f.Engines) != 0 {
		t.Fatalf("engines file after a stop: %+v, want none", f)
	}
}
