package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The state directory is trusted only when it is safe (docs/security.md,
// "The state directory"): an attack wrote, into a state
// directory others could write, an engines file naming a process and a
// file that poold never started, and poold killed the one and removed the
// other at its next start.

// nobody is the uid of the tests' processes and files of another user.
const nobody = 65534

// victims are what a forged engines file names: a process, a file as a
// shim's socket and a directory as an engine's cgroup, all outside the
// state directory.
type victims struct {
	pid          int
	file, cgroup string
}

// forge starts the victims and writes an engines file of this boot naming
// them into state. The process is another user's when the test runs as
// root; else it is the test's own, and named only with ownProcess (poold,
// which runs as the same user, would rightly take it for its own).
func forge(t *testing.T, state string, ownProcess bool) victims {
	t.Helper()
	cmd := exec.Command("sleep", "120")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	root := os.Geteuid() == 0
	if root {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: nobody, Gid: nobody}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	elsewhere := t.TempDir()
	v := victims{pid: cmd.Process.Pid, file: filepath.Join(elsewhere, "engine-victim.sock"), cgroup: filepath.Join(elsewhere, "engine-victim")}
	writeFile(t, v.file, []byte("precious"))
	if err := os.MkdirAll(filepath.Join(v.cgroup, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	start, err := strconv.ParseUint(startTime(v.pid), 10, 64)
	if err != nil {
		t.Fatalf("start time of %d: %v", v.pid, err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		Pool       string `json:"pool"`
		Profile    string `json:"profile"`
		PID        int    `json:"pid"`
		PGID       int    `json:"pgid"`
		StartTicks uint64 `json:"startTicks"`
		Token      string `json:"token"`
		Cgroup     string `json:"cgroup,omitempty"`
		Shim       string `json:"shim,omitempty"`
	}
	g := gone.Process.Pid
	recs := []rec{
		{Pool: "p0", Profile: "m", PID: g, PGID: g, Token: "forged", Shim: v.file},
		{Pool: "p0", Profile: "m", PID: g, PGID: g, Token: "forged", Cgroup: v.cgroup},
	}
	if root || ownProcess {
		recs = append(recs, rec{Pool: "p0", Profile: "m", PID: v.pid, PGID: v.pid, StartTicks: start, Token: "forged"})
	} else {
		t.Log("not root: no process of another user to name")
	}
	data, _ := json.Marshal(map[string]any{"bootId": strings.TrimSpace(string(boot)), "engines": recs})
	writeFile(t, filepath.Join(state, "engines.json"), data)
	return v
}

// check fails the test for each victim that did not survive.
func (v victims) check(t *testing.T) {
	t.Helper()
	if !alive(v.pid) {
		t.Errorf("the process %d named by the forged engines file was killed", v.pid)
	}
	for _, p := range []string{v.file, filepath.Join(v.cgroup, "empty")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s, named by the forged engines file, was removed: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(v.cgroup, "cgroup.kill")); err == nil {
		t.Errorf("poold wrote a cgroup.kill in %s", v.cgroup)
	}
}

// A state directory that others can write, or that belongs to another
// user, is refused: poold exits 1 naming the path and the fix, before it
// acts on anything there.
func TestUntrustedStateDirRefused(t *testing.T) {
	for _, tt := range []struct {
		name string
		// prepare makes the state directory untrusted and returns what
		// the error must say.
		prepare func(t *testing.T, state string) string
	}{
		{"world-writable", func(t *testing.T, state string) string {
			if err := os.Chmod(state, 0o777); err != nil {
				t.Fatal(err)
			}
			return state + " is writable by others than poold's user (mode 0777): run chmod 0750 " + state
		}},
		{"owned by another user", func(t *testing.T, state string) string {
			if os.Geteuid() != 0 {
				t.Skip("needs root, to give the directory to another user (uid 65534)")
			}
			if err := os.Chown(state, nobody, nobody); err != nil {
				t.Fatal(err)
			}
			return state + " is owned by uid 65534, not by poold's user (uid 0): run chown 0 " + state
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tag := t.Name()
			state := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(state, 0o700); err != nil {
				t.Fatal(err)
			}
			v := forge(t, state, true)
			want := tt.prepare(t, state)
			d := launch(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "m"}}, nil),
				"--keep-engines-on-restart", "--state-dir", state)
			select {
			case <-d.exited:
			case <-time.After(20 * time.Second):
				t.Fatal("poold did not exit on an untrusted state directory")
			}
			var exit *exec.ExitError
			if !asExit(d.err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1", d.err)
			}
			if out := d.stderr.String(); !strings.Contains(out, "state directory not trusted: "+want) {
				t.Fatalf("stderr does not say %q:\n%s", want, out)
			}
			v.check(t)
		})
	}
}

// In a state directory poold trusts, an engines file that names what poold
// never started (a process of another user, a file outside the directory
// as a shim's socket, a directory outside poold's delegated cgroup as an
// engine's cgroup) is not acted on: poold serves, logs each record it
// refuses, and every victim survives its start and its stop.
func TestForgedLedgerNotActedOn(t *testing.T) {
	tag := t.Name()
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	v := forge(t, state, false)
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m"}}, nil),
		"--keep-engines-on-restart", "--state-dir", state)
	d.waitPool("p0", 30*time.Second, "m ready", func(p poolView) bool { return p.State == "ready" })
	d.chat("m")
	v.check(t)
	d.stop()
	v.check(t)
	logs := d.stderr.String()
	if os.Geteuid() == 0 && !strings.Contains(logs, "runs as uid 65534 (effective 65534), not as poold's user (uid 0)") {
		t.Errorf("the log does not refuse the record of the process of uid %d:\n%s", nobody, tail(logs, 40))
	}
	if want := "its supervisor's socket " + v.file + " is not one in the state directory"; !strings.Contains(logs, want) {
		t.Errorf("the log does not say %q:\n%s", want, tail(logs, 40))
	}
	// Without a delegated cgroup (the usual test host) the cgroup is
	// dropped from the record; with one, the record is refused.
	if !strings.Contains(logs, "not acting on a recorded engine's cgroup") && !strings.Contains(logs, "its cgroup "+v.cgroup+" is not an engine group") {
		t.Errorf("the log does not refuse the cgroup %s:\n%s", v.cgroup, tail(logs, 40))
	}
	stopEngines(t, state, tag)
}
