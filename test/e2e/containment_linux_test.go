//go:build linux

package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// In cgroup mode, every process an engine starts ends with it, one that
// both calls setsid and clears its environment included. The test needs a
// cgroup v2 group it may create and move poold into; it skips without one.
func TestEscapedProcessesEndCgroupMode(t *testing.T) {
	parent, err := delegatedTestCgroup(t)
	if err != nil {
		t.Skipf("no writable cgroup v2 group to delegate to poold here (%v); cgroup mode is untested", err)
	}
	checkEscapesEnd(t, true, "cgroup", func(tag string, profiles []byte, args ...string) *daemon {
		return launchInCgroup(t, parent, tag, profiles, append([]string{"--containment", "cgroup"}, args...)...)
	})
}

// launchInCgroup launches poold in the cgroup at parent, as systemd starts
// it in the group it delegates.
func launchInCgroup(t *testing.T, parent, tag string, profiles []byte, args ...string) *daemon {
	t.Helper()
	return launchWith(t, tag, profiles, func(cmd *exec.Cmd) {
		cg, err := os.Open(parent)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cg.Close() })
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	}, args...)
}

// delegatedTestCgroup creates a cgroup v2 group under the test's own, as
// systemd's Delegate=yes would give poold one, and removes it (with what
// poold created in it) at the test's end.
func delegatedTestCgroup(t *testing.T) (string, error) {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var rel string
	for line := range strings.Lines(string(own)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			rel = p
		}
	}
	mount, err := cgroup2MountPoint()
	if err != nil {
		return "", err
	}
	if rel == "" {
		return "", errors.New("no cgroup v2 group in /proc/self/cgroup")
	}
	dir := filepath.Join(mount, rel, fmt.Sprintf("poold-e2e-%d-%s", os.Getpid(), strings.ToLower(t.Name())))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		os.Remove(dir)
		return "", fmt.Errorf("no cgroup.kill (Linux before 5.14): %w", err)
	}
	t.Cleanup(func() {
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, d := range slices.Backward(dirs) {
			if err := os.Remove(d); err != nil {
				t.Errorf("removing the test's cgroup: %v", err)
			}
		}
	})
	return dir, nil
}

// cgroup2MountPoint is where the cgroup2 file system is mounted.
func cgroup2MountPoint() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		before, after, ok := strings.Cut(sc.Text(), " - ")
		if fields := strings.Fields(before); ok && len(fields) >= 5 && strings.HasPrefix(after, "cgroup2 ") {
			return fields[4], nil
		}
	}
	return "", errors.New("no cgroup2 mount")
}

// In cgroup mode with keep-engines-on-restart, the shim starts its engine
// in the engine's cgroup and stays out of it, so that a stop, which ends
// the whole group, never ends the shim before it reports: a swap stops the
// engine through its shim, and the shim ends once it has.
func TestShimOutsideEngineCgroup(t *testing.T) {
	parent, err := delegatedTestCgroup(t)
	if err != nil {
		t.Skipf("no writable cgroup v2 group to delegate to poold here (%v); cgroup mode is untested", err)
	}
	tag := t.Name()
	state := t.TempDir()
	d := launchInCgroup(t, parent, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{{ID: "a"}, {ID: "b"}}, nil),
		append([]string{"--containment", "cgroup"}, keepArgs(state, time.Minute)...)...)
	d.waitHealthy()
	if mode, reason := d.containmentMode(); mode != "cgroup" {
		t.Fatalf("containment %q (%s), want cgroup", mode, reason)
	}
	engine := d.serving("p0", "a")
	shim := shimOf(t, tag)
	eg, sg := procCgroup(t, engine), procCgroup(t, shim)
	if !strings.Contains(filepath.Base(eg), "engine-p0-") || sg == eg || strings.HasPrefix(sg, eg+"/") {
		t.Fatalf("the engine is in %s, its shim in %s: want the engine alone in its engine group", eg, sg)
	}
	d.chat("b") // a swap: a is stopped through its shim
	deadline := time.Now().Add(time.Minute)
	for alive(shim) || alive(engine) {
		if time.Now().After(deadline) {
			t.Fatalf("after the swap, a's engine (alive: %v) or its shim (alive: %v) runs on", alive(engine), alive(shim))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(d.logLines("the engine's supervisor did not stop it")); n != 0 {
		t.Errorf("%d log lines say a shim did not stop its engine", n)
	}
	d.stop()
	stopEngines(t, state, tag)
}
