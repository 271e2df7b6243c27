package engine

import (
	"bufio"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poold/poold/internal/shim"
)

// startHandle starts script under sh through sup, marked with a fresh
// token; its stop is the test's cleanup.
func startHandle(t *testing.T, sup *Supervisor, script string) (Handle, Spec) {
	t.Helper()
	sp := Spec{Argv: []string{"sh", "-c", script}, Env: os.Environ(), Given: []string{"A=1"}, Token: rand.Text(), Port: 41000, Pool: "g", Grace: 5 * time.Second}
	h, err := sup.Start(sp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(0, nil, slog.New(slog.DiscardHandler)); err != nil {
			t.Error(err)
		}
	})
	return h, sp
}

// lines reads the first n lines of h's output.
func lines(t *testing.T, h Handle, n int) []string {
	t.Helper()
	got := make(chan []string, 1)
	go func() {
		var l []string
		sc := bufio.NewScanner(h.Output())
		for len(l) < n && sc.Scan() {
			l = append(l, sc.Text())
		}
		got <- l
	}()
	select {
	case l := <-got:
		return l
	case <-time.After(30 * time.Second):
		t.Fatalf("no %d lines of output within 30s", n)
		return nil
	}
}

// exited waits for h's exit.
func exited(t *testing.T, h Handle) {
	t.Helper()
	select {
	case <-h.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not exit")
	}
}

// An engine that is poold's own child: its output, its members, its exit
// status, and a stop that ends it; it cannot be detached.
func TestChildHandle(t *testing.T) {
	sup := &Supervisor{Spawn: ProcessSpawner()}
	h, sp := startHandle(t, sup, "echo one; echo two; exec sleep 60")
	if l := lines(t, h, 2); !slices.Equal(l, []string{"one", "two"}) {
		t.Fatalf("output %q, want one, two", l)
	}
	if m := h.Members(); !slices.Contains(m, h.PID()) {
		t.Fatalf("members %v lack the engine %d", m, h.PID())
	}
	rec := h.Record()
	if rec.PID != h.PID() || rec.PGID != h.PID() || rec.Port != sp.Port || h.Port() != sp.Port || rec.Token != sp.Token || rec.StartTicks == 0 || rec.Shim != "" {
		t.Fatalf("record %+v of the engine %d started as %+v", rec, h.PID(), sp)
	}
	if h.Detach() || len(h.Seen()) != 0 {
		t.Fatal("a child of poold's own was detached, or has output seen before")
	}
	if err := h.Stop(5*time.Second, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	exited(t, h)
	if alive(h.PID()) || len(h.Members()) != 0 || h.Err() == nil || !strings.Contains(h.Err().Error(), "terminated") {
		t.Fatalf("after the stop: alive %v, members %v, exit %v; want it ended by SIGTERM", alive(h.PID()), h.Members(), h.Err())
	}
}

// A child's exit is seen with its status, and a signal reaches it.
func TestChildHandleExitAndSignal(t *testing.T) {
	sup := &Supervisor{Spawn: ProcessSpawner()}
	h, _ := startHandle(t, sup, "exit 3")
	exited(t, h)
	if h.Err() == nil || h.Err().Error() != "exit status 3" {
		t.Fatalf("exit %v, want exit status 3", h.Err())
	}
	h, _ = startHandle(t, sup, "exec sleep 60")
	if err := h.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	exited(t, h)
	if h.Err() == nil || !strings.Contains(h.Err().Error(), "killed") {
		t.Fatalf("exit %v, want killed", h.Err())
	}
}

// An engine under a real shim: its output comes through the shim; once
// detached it runs on, and another attach adopts it, with the output
// already received and its fingerprint; its stop goes through the shim.
func TestShimmedHandle(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sup := &Supervisor{Shims: &Shims{Dir: realTempDir(t), AdoptTimeout: time.Minute}, Spawn: ProcessSpawner(), Self: self}
	h, sp := startHandle(t, sup, "echo hello; exec sleep 60")
	if l := lines(t, h, 1); !slices.Equal(l, []string{"hello"}) {
		t.Fatalf("output %q, want hello", l)
	}
	if m := h.Members(); !slices.Contains(m, h.PID()) {
		t.Fatalf("members %v lack the engine %d", m, h.PID())
	}
	rec := h.Record()
	if rec.PID != h.PID() || rec.Token != sp.Token || rec.StartTicks == 0 || rec.Shim == "" {
		t.Fatalf("record %+v of a shimmed engine", rec)
	}
	if !h.Detach() {
		t.Fatal("a shimmed engine was not detached")
	}
	exited(t, h)
	if !errors.Is(h.Err(), errDetached) || !alive(h.PID()) {
		t.Fatalf("after the detach: exit %v, alive %v; want it running on", h.Err(), alive(h.PID()))
	}

	a, err := sup.Adopt(rec, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, a.Output()) }()
	if err := a.Recorded(); err != nil {
		t.Fatalf("Recorded: %v", err)
	}
	if a.Fingerprint() != shim.Fingerprint(sp.Argv, sp.Given) || !slices.Equal(a.Seen(), []string{"hello"}) {
		t.Fatalf("adopted with fingerprint %q and output seen %q", a.Fingerprint(), a.Seen())
	}
	if err := a.Stop(5*time.Second, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	exited(t, a)
	if alive(a.PID()) || len(a.Members()) != 0 || a.Err() == nil {
		t.Fatalf("after the stop: alive %v, members %v, exit %v", alive(a.PID()), a.Members(), a.Err())
	}
}

// Adopt refuses a shim that runs another pid than the recorded one.
func TestAdoptChecksThePID(t *testing.T) {
	f := startFakeShim(t, false)
	var sup Supervisor
	_, err := sup.Adopt(LedgerEngine{PID: f.eng.Process.Pid + 1, Shim: f.path}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "its supervisor runs pid") {
		t.Fatalf("Adopt: %v; want the pid refused", err)
	}
}

// A signal to an engine under a shim is asked of its shim: poold signals
// nothing that a shim holds.
func TestShimmedSignalGoesThroughTheShim(t *testing.T) {
	f := startFakeShim(t, false)
	h := f.handle(t)
	if err := h.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	select {
	case a := <-f.asked:
		if a.r.Op != shim.OpSignal || a.r.Signal != int(syscall.SIGKILL) || !a.alive {
			t.Fatalf("the shim was asked %+v (engine alive: %v); want SIGKILL of a running engine", a.r, a.alive)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the shim was asked nothing")
	}
	exited(t, h)
	if h.Err() == nil || h.Err().Error() != "signal: killed" {
		t.Fatalf("exit %v, want the shim's report", h.Err())
	}
}
