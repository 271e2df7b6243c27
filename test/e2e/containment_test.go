package e2e

// Containment (docs/security.md): no process an engine starts outlives it,
// whatever it does to leave the engine's process group or environment.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// escaper is an engine that starts, before the simulator, grandchildren that
// escape its process group: one with setsid, one with env -i (which drops
// the engine's token), and, with both, one that does both. It writes their
// pids to files in dir.
func escaper(tag, id, dir string, both bool) sim {
	script := fmt.Sprintf("setsid sleep 600 & echo $! > %[1]s/setsid\nenv -i sleep 600 & echo $! > %[1]s/env-i\n", dir)
	if both {
		script += fmt.Sprintf("setsid env -i sleep 600 & echo $! > %s/both\n", dir)
	}
	script += "exec {poold} engine-sim /models/{id} --port {port} --served-model-name {id}"
	return sim{ID: id, Extra: map[string]any{"command": []string{"sh", "-c", script}}}
}

// proc is a process known by its pid and start time, so that a reused pid is
// never taken for it.
type proc struct {
	name  string
	pid   int
	start string
}

// escapees reads the pids the escaper wrote to dir and the processes' start
// times; killed at the test's end in any case.
func escapees(t *testing.T, dir string) []proc {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ps []proc
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		p := proc{name: e.Name(), pid: pid, start: startTime(pid)}
		if p.start == "" || !alive(pid) {
			t.Fatalf("escaped process %s (%d) is not running", p.name, pid)
		}
		ps = append(ps, p)
		t.Cleanup(func() {
			if p.running() {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		})
	}
	return ps
}

// startTime is field 22 of /proc/PID/stat, or "".
func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func (p proc) running() bool { return alive(p.pid) && startTime(p.pid) == p.start }

// survivors names the processes of ps still running.
func survivors(ps []proc) []string {
	var out []string
	for _, p := range ps {
		if p.running() {
			out = append(out, fmt.Sprintf("%s (%d)", p.name, p.pid))
		}
	}
	return out
}

// containmentMode reads /status's containment.
func (d *daemon) containmentMode() (mode, reason string) {
	d.t.Helper()
	c := d.status().Containment
	return c.Mode, c.Reason
}

// checkEscapesEnd runs the engine that escapes (with both kinds of escape
// at once when both) through a stop, a graceful shutdown, and a SIGKILL of
// poold followed by a restart, and checks after each that none of its
// processes is left. launch starts a poold on the state directory given.
func checkEscapesEnd(t *testing.T, both bool, wantMode string, launch func(tag string, profiles []byte, args ...string) *daemon) {
	tag := t.Name()
	pids := t.TempDir()
	profiles := profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "esc"}},
		[]sim{escaper(tag, "esc", pids, both), {ID: "other"}}, nil)
	ready := func(d *daemon, profile string) {
		t.Helper()
		d.waitHealthy()
		d.waitPool("p0", 30*time.Second, profile+" ready", func(p poolView) bool { return p.State == "ready" && p.Profile == profile })
	}

	// A stop: a swap to another profile.
	d := launch(tag, profiles)
	ready(d, "esc")
	if mode, reason := d.containmentMode(); mode != wantMode {
		t.Fatalf("containment %q (%s), want %q", mode, reason, wantMode)
	}
	ps := escapees(t, pids)
	if code, _, body, err := d.post(t.Context(), "/v1/chat/completions", chatBody("other", false, 1)); err != nil || code != http.StatusOK {
		t.Fatalf("swap: %d %s %v", code, body, err)
	}
	if left := survivors(ps); len(left) > 0 {
		t.Fatalf("after a stop, the engine's escaped processes %v survive", left)
	}
	d.stop() // one poold at a time: a delegated cgroup is one poold's

	// A graceful shutdown.
	d = launch(tag, profiles)
	ready(d, "esc")
	ps = escapees(t, pids)
	d.stop()
	if left := survivors(ps); len(left) > 0 {
		t.Fatalf("after a graceful shutdown, the engine's escaped processes %v survive", left)
	}

	// poold SIGKILLed, then started again on the same state directory.
	state := filepath.Join(t.TempDir(), "state")
	d = launch(tag, profiles, "--state-dir", state)
	ready(d, "esc")
	ps = escapees(t, pids)
	_ = d.cmd.Process.Kill()
	<-d.exited
	if left := survivors(ps); len(left) != len(ps) {
		t.Fatalf("only %v of %d escaped processes outlived poold's SIGKILL: nothing to clean up", left, len(ps))
	}
	d = launch(tag, profiles, "--state-dir", state)
	d.waitHealthy() // the clean-up runs before poold serves
	if left := survivors(ps); len(left) > 0 {
		t.Fatalf("after a SIGKILL and a restart, the engine's escaped processes %v survive", left)
	}
	ready(d, "esc")
}

// In process-group mode (always tested), a grandchild that calls setsid and
// one started with env -i end with their engine: on a stop, on a graceful
// shutdown, and when poold is SIGKILLed and started again.
func TestEscapedProcessesEndProcessGroupMode(t *testing.T) {
	checkEscapesEnd(t, false, "process-group", func(tag string, profiles []byte, args ...string) *daemon {
		return launch(t, tag, profiles, append([]string{"--containment", "process-group"}, args...)...)
	})
}

// Without a cgroup delegated to it alone (the tests share theirs), poold
// falls back to process groups: it says so once in its log, and /status
// shows the mode and why.
func TestDegradedContainmentReported(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m"}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	if mode, reason := d.containmentMode(); mode != "process-group" || reason == "" {
		t.Fatalf("containment %q (%q), want process-group with a reason", mode, reason)
	}
	if n := strings.Count(d.stderr.String(), "degraded containment"); n != 1 {
		t.Fatalf("the degraded mode is logged %d times, want once", n)
	}
}

// procCgroup is the cgroup v2 path of process pid, as /proc/PID/cgroup gives it.
func procCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return p
		}
	}
	t.Fatalf("process %d is in no cgroup v2 group: %q", pid, b)
	return ""
}
