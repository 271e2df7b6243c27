package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// shimOf returns the pid of the one live engine shim of the test tag.
func shimOf(t *testing.T, tag string) int {
	t.Helper()
	var shims []int
	for _, pid := range taggedProcesses(tag) {
		cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte("\x00engine-shim\x00")) {
			shims = append(shims, pid)
		}
	}
	if len(shims) != 1 {
		t.Fatalf("engine shims of %s: %v, want one", tag, shims)
	}
	return shims[0]
}

// TestStalledPooldEngineDies: poold reads nothing from its shim (it is
// stopped, SIGSTOP) while its engine floods its output and dies. The shim
// does not wait for poold forever: it ends, and poold, running again, finds
// the connection gone (logged with the reason) instead of keeping the dead
// engine ready: the next request is served by a fresh engine, not
// answered 502.
func TestStalledPooldEngineDies(t *testing.T) {
	tag := t.Name()
	trigger := filepath.Join(t.TempDir(), "die")
	profiles := profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}},
		[]sim{helperSim(tag, "a", "flood-die", trigger)}, nil)
	state := t.TempDir()
	d := startPoold(t, tag, profiles, keepArgs(state, time.Minute)...)
	engine := d.serving("p0", "a")
	shim := shimOf(t, tag)

	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	resume := func() {
		if stopped {
			stopped = false
			_ = d.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for alive(shim) {
		if time.Now().After(deadline) {
			resume()
			t.Fatalf("the shim %d did not end within 2m of its engine's death while poold read nothing (engine alive: %v)", shim, alive(engine))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if alive(engine) {
		t.Fatalf("the engine %d outlived its shim", engine)
	}
	resume()

	d.waitPool("p0", time.Minute, "the dead engine dropped", func(p poolView) bool { return p.Engine == nil || p.Engine.PID != engine })
	d.chat("a")
	if p := d.pool("p0"); p.Engine == nil || p.Engine.PID == engine {
		t.Fatalf("pool %+v, want a fresh engine", p)
	}
	if l := d.logLinesAtLeast("lost the connection to the engine's supervisor", 1); len(l) != 1 || l[0]["err"] == nil {
		t.Errorf("log lines on the lost connection: %v, want one with its reason", l)
	}
	d.stop()
	stopEngines(t, state, tag)
}
