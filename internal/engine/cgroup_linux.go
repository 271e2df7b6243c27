package engine

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// cgroup v2 mechanics: finding the cgroup delegated to poold, a group per
// engine, and ending a group.

// supervisorGroup is the leaf of the delegated cgroup that poold moves itself
// into: cgroup v2 lets a group either hold processes or enable controllers
// for its children, not both (the no-internal-processes rule), so the
// delegated cgroup keeps only groups, poold's and its engines'.
const supervisorGroup = "supervisor"

// delegatedCgroup finds the cgroup v2 group that poold may manage, moves poold
// into its leaf "supervisor", and returns the group's directory. That is the
// group poold runs in, or its parent when poold already runs in a
// "supervisor" leaf (systemd's DelegateSubgroup=supervisor, or a restart),
// provided that poold can create groups in it and that no other process runs
// in it: under systemd that is a service with Delegate=yes. The machine's
// root cgroup is never used.
func delegatedCgroup() (string, error) {
	own, err := ownCgroup()
	if err != nil {
		return "", err
	}
	mount, root, err := cgroup2Mount()
	if err != nil {
		return "", err
	}
	rel, ok := strings.CutPrefix(own, root)
	if !ok {
		return "", fmt.Errorf("poold's cgroup %s is outside the cgroup2 mount of %s", own, root)
	}
	base := filepath.Join(mount, rel)
	if path.Base(own) == supervisorGroup {
		base = filepath.Dir(base)
	}
	// The machine's root cgroup has no cgroup.events; the root of a cgroup
	// namespace (systemd's ProtectControlGroups=private) is a group like any.
	if _, err := os.Stat(filepath.Join(base, "cgroup.events")); err != nil {
		return "", errors.New("poold runs in the root cgroup, not in one delegated to it (run it under systemd with Delegate=yes)")
	}
	self := os.Getpid()
	if others := slices.DeleteFunc(cgroupOwnProcs(base), func(pid int) bool { return pid == self }); len(others) > 0 {
		return "", fmt.Errorf("cgroup %s holds other processes than poold (%v): it is not delegated to poold alone", base, others)
	}
	sup := filepath.Join(base, supervisorGroup)
	if err := os.Mkdir(sup, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("cgroup %s is not writable (run poold under systemd with Delegate=yes): %w", base, err)
	}
	if err := os.WriteFile(filepath.Join(sup, "cgroup.procs"), []byte(strconv.Itoa(self)), 0); err != nil {
		return "", fmt.Errorf("moving poold into %s: %w", sup, err)
	}
	return base, nil
}

// ownCgroup is poold's cgroup v2 path, from /proc/self/cgroup.
func ownCgroup() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("reading poold's cgroup: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("poold is in no cgroup v2 group (cgroup v1 only)")
}

// cgroup2Mount finds the cgroup2 file system in /proc/self/mountinfo: its
// mount point and the cgroup path at that point.
func cgroup2Mount() (mount, root string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options [optional…] - fstype source super
		before, after, ok := strings.Cut(sc.Text(), " - ")
		fields := strings.Fields(before)
		if !ok || len(fields) < 5 || !strings.HasPrefix(after, "cgroup2 ") {
			continue
		}
		return unescapeMount(fields[4]), unescapeMount(fields[3]), nil
	}
	return "", "", errors.New("no cgroup2 file system is mounted")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// newEngineGroup creates the group of a new engine under base, named after
// its pool and token, and opens it for clone3's CLONE_INTO_CGROUP.
func newEngineGroup(base, pool, token string) (dir string, fd *os.File, err error) {
	dir = filepath.Join(base, engineGroupPrefix+pool+"-"+strings.ToLower(token[:min(len(token), 10)]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("creating the engine's cgroup: %w", err)
	}
	fd, err = os.Open(dir)
	if err != nil {
		_ = os.Remove(dir)
		return "", nil, fmt.Errorf("opening the engine's cgroup: %w", err)
	}
	return dir, fd, nil
}

// UseCgroup makes an engine started with attr start inside the cgroup open
// as fd (clone3's CLONE_INTO_CGROUP): NewEngineGroup's.
func UseCgroup(attr *syscall.SysProcAttr, fd *os.File) {
	attr.UseCgroupFD = true
	attr.CgroupFD = int(fd.Fd())
}

// cgroupOwnProcs lists the processes of the group at dir itself.
func cgroupOwnProcs(dir string) []int {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for f := range bytes.FieldsSeq(data) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupProcs lists the live processes of the group at dir and of its
// descendant groups (an engine may create those in its own).
func cgroupProcs(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			pids = append(pids, cgroupOwnProcs(p)...)
		}
		return nil
	})
	return pids
}

// killCgroup kills every process of the group at dir and its descendants:
// through cgroup.kill (Linux 5.14), which no fork escapes, else with a
// SIGKILL to each.
func killCgroup(dir string) {
	if os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0) == nil {
		return
	}
	for _, pid := range cgroupProcs(dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// RemoveCgroup removes the empty group at dir and its descendant groups,
// deepest first: an engine's, once its tree has ended.
func RemoveCgroup(dir string) error {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for _, d := range slices.Backward(dirs) {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// engineGroups lists the engine groups under base.
func engineGroups(base string) []string {
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), engineGroupPrefix) {
			dirs = append(dirs, filepath.Join(base, e.Name()))
		}
	}
	return dirs
}
