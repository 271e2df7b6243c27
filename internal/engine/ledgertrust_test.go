package engine

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// nobody is the uid (and gid) of the tests' processes and files of another
// user.
const nobody = 65534

// openLedgerIn opens the ledger of dir for poold's engines contained by
// contain.
func openLedgerIn(dir string, contain *Containment) (*Ledger, error) {
	return OpenLedger(dir, contain, nil, slog.New(slog.DiscardHandler))
}

// needRoot skips a test that must create files or processes of another
// user.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to create files and processes of another user (uid 65534)")
	}
}

// A state directory that others could have written is refused, with the
// path and the fix in the error; one that only poold's user (and root) can
// write is opened, through symbolic links.
func TestStateDirRefusedUnlessSafe(t *testing.T) {
	for _, tt := range []struct {
		name string
		root bool // needs root (chown)
		// make prepares the state directory, in a fresh directory of
		// the test, and returns it and the path and fix the error
		// names; want "" for a directory that is trusted.
		make func(t *testing.T, top string) (dir, want string)
	}{
		{name: "world-writable", make: func(t *testing.T, top string) (string, string) {
			dir := mkdir(t, filepath.Join(top, "state"), 0o777)
			return dir, "(mode 0777): run chmod 0750 " + dir
		}},
		{name: "group-writable", make: func(t *testing.T, top string) (string, string) {
			dir := mkdir(t, filepath.Join(top, "state"), 0o770)
			return dir, "(mode 0770): run chmod 0750 " + dir
		}},
		{name: "owned by another user", root: true, make: func(t *testing.T, top string) (string, string) {
			dir := mkdir(t, filepath.Join(top, "state"), 0o700)
			chown(t, dir)
			return dir, dir + " is owned by uid 65534, not by poold's user (uid 0): run chown 0 " + dir
		}},
		{name: "parent writable by others", make: func(t *testing.T, top string) (string, string) {
			parent := mkdir(t, filepath.Join(top, "shared"), 0o777)
			return mkdir(t, filepath.Join(parent, "state"), 0o700), "is in " + parent + " (mode 0777), which others may write without the sticky bit, so they can replace it: run chmod go-w " + parent
		}},
		{name: "parent owned by another user", root: true, make: func(t *testing.T, top string) (string, string) {
			parent := mkdir(t, filepath.Join(top, "home"), 0o755)
			chown(t, parent)
			return mkdir(t, filepath.Join(parent, "state"), 0o700), "is in " + parent + ", owned by uid 65534"
		}},
		{name: "engines file writable by others", make: func(t *testing.T, top string) (string, string) {
			dir := mkdir(t, filepath.Join(top, "state"), 0o700)
			f := writeFile(t, filepath.Join(dir, "engines.json"), 0o666)
			return dir, f + " is writable by others than poold's user (mode 0666): run chmod 0640 " + f
		}},
		{name: "engines file of another user", root: true, make: func(t *testing.T, top string) (string, string) {
			dir := mkdir(t, filepath.Join(top, "state"), 0o700)
			f := writeFile(t, filepath.Join(dir, "engines.json"), 0o600)
			chown(t, f)
			return dir, f + " is owned by uid 65534"
		}},
		{name: "lock a symbolic link", make: func(t *testing.T, top string) (string, string) {
			dir := mkdir(t, filepath.Join(top, "state"), 0o700)
			victim := writeFile(t, filepath.Join(top, "victim"), 0o600)
			if err := os.Symlink(victim, filepath.Join(dir, "lock")); err != nil {
				t.Fatal(err)
			}
			return dir, filepath.Join(dir, "lock") + " is a symbolic link"
		}},
		{name: "sticky parent", make: func(t *testing.T, top string) (string, string) {
			parent := mkdir(t, filepath.Join(top, "tmp"), 0o777|os.ModeSticky)
			return mkdir(t, filepath.Join(parent, "state"), 0o750), ""
		}},
		{name: "through a symbolic link", make: func(t *testing.T, top string) (string, string) {
			mkdir(t, filepath.Join(top, "real"), 0o700)
			link := filepath.Join(top, "link")
			if err := os.Symlink("real", link); err != nil {
				t.Fatal(err)
			}
			return link, ""
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				needRoot(t)
			}
			top, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			dir, want := tt.make(t, top)
			l, err := openLedgerIn(dir, nil)
			if want == "" {
				if err != nil {
					t.Fatalf("refused a safe state directory: %v", err)
				}
				defer l.Close()
				if real, _ := filepath.EvalSymlinks(dir); l.Dir() != real {
					t.Fatalf("Dir() = %q, want %q, links resolved", l.Dir(), real)
				}
				return
			}
			if err == nil {
				l.Close()
				t.Fatalf("opened an unsafe state directory; want an error saying %q", want)
			}
			if !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q, want ErrUntrusted saying %q", err, want)
			}
		})
	}
}

// A forged engines file, in a state directory poold trusts, names what
// poold never started; none of it is signalled or removed. The records of
// files and directories name a process that has exited, so that only the
// field under test can make them acted on.
func TestForgedRecordsNotActedOn(t *testing.T) {
	gone := exitedPID(t)
	for _, tt := range []struct {
		name string
		// base, when set, stands a directory in for the delegated
		// cgroup: the checks of a record are the same.
		base bool
		// forge returns the record and a check, after the reap, that
		// its victim survived. state is the state directory; victims
		// go to elsewhere; base is the delegated cgroup, or "".
		forge func(t *testing.T, state, elsewhere, base string) (LedgerEngine, func(t *testing.T))
	}{
		{name: "process of another user", forge: func(t *testing.T, _, _, _ string) (LedgerEngine, func(t *testing.T)) {
			needRoot(t)
			cmd := exec.Command("sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			if err := cmd.Start(); err != nil {
				t.Skipf("cannot start a process as uid %d: %v", nobody, err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			pid := cmd.Process.Pid
			st, err := ProcStat(pid)
			if err != nil {
				t.Fatal(err)
			}
			return LedgerEngine{Pool: "g", Profile: "a", PID: pid, PGID: pid, StartTicks: st.Start, Token: "forged"}, func(t *testing.T) {
				if !alive(pid) {
					t.Errorf("the process %d of uid %d was killed", pid, nobody)
				}
			}
		}},
		{name: "shim outside the state directory", forge: func(t *testing.T, _, elsewhere, _ string) (LedgerEngine, func(t *testing.T)) {
			victim := writeFile(t, filepath.Join(elsewhere, "engine-x.sock"), 0o600)
			writeFile(t, victim+".log", 0o600)
			return LedgerEngine{Pool: "g", Profile: "a", PID: gone, PGID: gone, Shim: victim}, survives(victim, victim+".log")
		}},
		{name: "shim through dot-dot", forge: func(t *testing.T, state, elsewhere, _ string) (LedgerEngine, func(t *testing.T)) {
			victim := writeFile(t, filepath.Join(elsewhere, "engine-x.sock"), 0o600)
			rel, err := filepath.Rel(state, victim)
			if err != nil {
				t.Fatal(err)
			}
			return LedgerEngine{Pool: "g", Profile: "a", PID: gone, PGID: gone, Shim: state + "/" + rel}, survives(victim)
		}},
		{name: "shim log a symbolic link", forge: func(t *testing.T, state, elsewhere, _ string) (LedgerEngine, func(t *testing.T)) {
			victim := writeFile(t, filepath.Join(elsewhere, "victim"), 0o600)
			sock := filepath.Join(state, "engine-x.sock")
			if err := os.Symlink(victim, sock+".log"); err != nil {
				t.Fatal(err)
			}
			return LedgerEngine{Pool: "g", Profile: "a", PID: gone, PGID: gone, Shim: sock}, survives(victim, sock+".log")
		}},
		{name: "cgroup with no delegated cgroup", forge: func(t *testing.T, _, elsewhere, _ string) (LedgerEngine, func(t *testing.T)) {
			victim := mkdir(t, filepath.Join(elsewhere, "engine-x"), 0o755)
			mkdir(t, filepath.Join(victim, "empty"), 0o755)
			return LedgerEngine{Pool: "g", Profile: "a", PID: gone, PGID: gone, Cgroup: victim}, survives(filepath.Join(victim, "empty"))
		}},
		{name: "cgroup outside the delegated cgroup", base: true, forge: func(t *testing.T, _, elsewhere, _ string) (LedgerEngine, func(t *testing.T)) {
			victim := mkdir(t, filepath.Join(elsewhere, "engine-x"), 0o755)
			mkdir(t, filepath.Join(victim, "empty"), 0o755)
			return LedgerEngine{Pool: "g", Profile: "a", PID: gone, PGID: gone, Cgroup: victim}, survives(filepath.Join(victim, "empty"))
		}},
		{name: "cgroup a symbolic link out of the delegated cgroup", base: true, forge: func(t *testing.T, _, elsewhere, base string) (LedgerEngine, func(t *testing.T)) {
			victim := mkdir(t, filepath.Join(elsewhere, "victim"), 0o755)
			mkdir(t, filepath.Join(victim, "empty"), 0o755)
			link := filepath.Join(base, "engine-x")
			if err := os.Symlink(victim, link); err != nil {
				t.Fatal(err)
			}
			return LedgerEngine{Pool: "g", Profile: "a", PID: gone, PGID: gone, Cgroup: link}, survives(filepath.Join(victim, "empty"), link)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			state, elsewhere := realTempDir(t), realTempDir(t)
			var contain *Containment
			var base string
			if tt.base {
				base = realTempDir(t)
				contain = &Containment{base: base}
			}
			rec, check := tt.forge(t, state, elsewhere, base)
			writeRecords(t, state, rec)
			l, err := openLedgerIn(state, contain)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if _, err := l.Reap(0); err != nil {
				t.Fatal(err)
			}
			check(t)
			if _, err := os.Lstat(filepath.Join(rec.Cgroup, "cgroup.kill")); rec.Cgroup != "" && err == nil {
				t.Errorf("a cgroup.kill was written in %s", rec.Cgroup)
			}
		})
	}
}

// A recorded engine group directly under the delegated cgroup is one poold
// acts on; no other directory is.
func TestCheckEngineGroup(t *testing.T) {
	base := "/sys/fs/cgroup/system.slice/poold.service"
	for dir, ok := range map[string]bool{
		base + "/engine-g-abc":            true,
		base + "/supervisor":              false,
		base + "/engine-g-abc/child":      false,
		base + "/../sshd.service":         false,
		base + "/engine-g/../../engine-x": false,
		base + "/engine-g/..":             false,
		"/etc":                            false,
		base:                              false,
	} {
		if err := checkEngineGroup(dir, base); (err == nil) != ok {
			t.Errorf("checkEngineGroup(%q) = %v, want ok %v", dir, err, ok)
		}
	}
}

// survives checks that every path still exists.
func survives(paths ...string) func(t *testing.T) {
	return func(t *testing.T) {
		for _, p := range paths {
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("%s was removed: %v", p, err)
			}
		}
	}
}

// writeRecords writes an engines file of this boot recording engines.
func writeRecords(t *testing.T, dir string, engines ...LedgerEngine) {
	t.Helper()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skipf("no boot id: %v", err)
	}
	data, err := json.Marshal(ledgerFile{BootID: strings.TrimSpace(string(boot)), Engines: engines})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "engines.json"), data, 0o600); err != nil {
		t.Fatal(err)
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

// mkdir makes dir with exactly mode (no umask).
func mkdir(t *testing.T, dir string, mode os.FileMode) string {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// writeFile writes an empty file with exactly mode.
func writeFile(t *testing.T, path string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// chown gives path to the user nobody.
func chown(t *testing.T, path string) {
	t.Helper()
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}
