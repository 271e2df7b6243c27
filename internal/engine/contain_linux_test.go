package engine

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// In process-group mode, the grandchildren that left the group are the
// engine's by their token or their parent while the engine lives, and a stop
// ends them.
func TestStopEndsEscapedProcessesProcessGroupMode(t *testing.T) {
	e, escaped := startEscaper(t, nil)
	tree := e.tree()
	if m := tree.Members(); !slices.Contains(m, escaped[0]) || !slices.Contains(m, escaped[1]) {
		t.Fatalf("members %v lack the escaped processes %v", m, escaped)
	}
	if err := tree.End(5*time.Second, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if live := liveOf(escaped); len(live) > 0 {
		t.Fatalf("escaped processes %v outlived the stop", live)
	}
}

// In cgroup mode the engine runs in a group of its own, which holds its
// grandchildren whatever they do; a stop empties it, and it can then be
// removed. The test needs a cgroup v2 group it may create under its own, and
// skips without.
func TestStopEndsEscapedProcessesCgroupMode(t *testing.T) {
	base := testCgroup(t)
	e, escaped := startEscaper(t, &Containment{base: base})
	if !strings.HasPrefix(e.cgroup, filepath.Join(base, "engine-g-")) {
		t.Fatalf("engine cgroup %q, want one under %s", e.cgroup, base)
	}
	if m := cgroupProcs(e.cgroup); !slices.Contains(m, e.pid) || !slices.Contains(m, escaped[0]) || !slices.Contains(m, escaped[1]) {
		t.Fatalf("cgroup holds %v, want the engine %d and %v", m, e.pid, escaped)
	}
	if err := e.tree().End(5*time.Second, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if live := liveOf(escaped); len(live) > 0 {
		t.Fatalf("escaped processes %v outlived the stop", live)
	}
	<-e.exited
	if err := RemoveCgroup(e.cgroup); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.cgroup); !os.IsNotExist(err) {
		t.Fatalf("the engine's cgroup is still there: %v", err)
	}
}

// testCgroup creates a cgroup v2 group under the test's own, removed at the
// test's end, or skips the test.
func testCgroup(t *testing.T) string {
	t.Helper()
	own, err := ownCgroup()
	if err == nil {
		var mount, root string
		if mount, root, err = cgroup2Mount(); err == nil {
			dir := filepath.Join(mount, strings.TrimPrefix(own, root), "poold-test-"+strconv.Itoa(os.Getpid()))
			if err = os.Mkdir(dir, 0o755); err == nil {
				t.Cleanup(func() {
					if err := RemoveCgroup(dir); err != nil {
						t.Errorf("removing the test's cgroup: %v", err)
					}
				})
				return dir
			}
		}
	}
	t.Skipf("no writable cgroup v2 group here (%v)", err)
	return ""
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/sys/fs/cgroup`:         "/sys/fs/cgroup",
		`/mnt/with\040space`:     "/mnt/with space",
		`/a\134b`:                `/a\b`,
		`/trailing\04`:           `/trailing\04`,
		`/not\999octal\011tab/x`: "/not\\999octal\ttab/x",
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// The ledger acts on a recorded engine group under the delegated cgroup: a
// crash's leftovers in it, those that left the engine's group and
// environment too, are ended and the group removed at the next start.
func TestLedgerReapsRecordedGroupUnderTheBase(t *testing.T) {
	contain := &Containment{base: testCgroup(t)}
	dir := t.TempDir()
	first, err := openLedgerIn(dir, contain)
	if err != nil {
		t.Fatal(err)
	}
	e, escaped := startEscaper(t, contain)
	first.Add(e.record())
	first.Close() // the crash: the lock goes, and the engine's leader
	_ = syscall.Kill(e.pid, syscall.SIGKILL)
	<-e.exited

	second, err := openLedgerIn(dir, contain)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if _, err := second.Reap(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if live := liveOf(escaped); len(live) > 0 {
		t.Fatalf("escaped processes %v outlived the reap", live)
	}
	if _, err := os.Stat(e.cgroup); !os.IsNotExist(err) {
		t.Fatalf("the engine's cgroup is still there: %v", err)
	}
}
