package engine

import (
	"crypto/rand"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testEngine is an engine as poold starts one: a process leading a group of
// its own, marked with a token, in a cgroup of its own in cgroup mode.
type testEngine struct {
	pid    int
	token  string
	start  uint64 // the leader's, as ProcStat reads it
	cgroup string // "" in process-group mode
	exited chan struct{}
}

// tree is what a stop of the engine ends.
func (e *testEngine) tree() Tree {
	if e.cgroup != "" {
		return CgroupTree(e.cgroup, e.pid)
	}
	return GroupTree(e.pid, e.token, e.start)
}

// record is the engine as the ledger records it.
func (e *testEngine) record() LedgerEngine {
	return LedgerEngine{Pool: "g", Profile: "s", PID: e.pid, PGID: e.pid, StartTicks: e.start, Token: e.token, Cgroup: e.cgroup}
}

// startEngine starts script under sh as an engine of pool "g" contained by
// contain, from the process's spawner; its stop is the test's cleanup.
func startEngine(t *testing.T, contain *Containment, script string) *testEngine {
	t.Helper()
	e := &testEngine{token: rand.Text(), exited: make(chan struct{})}
	dir, fd, err := contain.NewEngineGroup("g", e.token)
	if err != nil {
		t.Fatal(err)
	}
	e.cgroup = dir
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), TokenEnv+"="+e.token)
	if cmd.SysProcAttr, err = ProcAttr(); err != nil {
		t.Fatal(err)
	}
	if fd != nil {
		UseCgroup(cmd.SysProcAttr, fd)
		defer fd.Close()
	}
	out, wait, err := StartChild(cmd, ProcessSpawner())
	if err != nil {
		t.Fatal(err)
	}
	out.Close()
	e.pid = cmd.Process.Pid
	st, err := ProcStat(e.pid)
	if err != nil {
		t.Fatal(err)
	}
	e.start = st.Start
	go func() {
		_ = wait()
		close(e.exited)
	}()
	t.Cleanup(func() {
		if err := e.tree().End(0, nil, slog.New(slog.DiscardHandler)); err != nil {
			t.Error(err)
		}
		<-e.exited
		if e.cgroup != "" {
			_ = RemoveCgroup(e.cgroup)
		}
	})
	return e
}

// startEscaper starts an engine whose grandchildren leave its process group:
// one with setsid (keeping the engine's token), one with setsid and env -i
// (keeping nothing but its parent). It returns the engine and their pids.
func startEscaper(t *testing.T, contain *Containment) (*testEngine, []int) {
	t.Helper()
	dir := t.TempDir()
	e := startEngine(t, contain, "setsid sleep 60 & echo $! > "+dir+"/a; setsid env -i sleep 60 & echo $! > "+dir+"/b; wait")
	return e, readPIDs(t, dir, "a", "b")
}

// readPIDs waits (bounded) for each named file of dir to hold a pid, and
// returns them; each process is killed at the test's end.
func readPIDs(t *testing.T, dir string, names ...string) []int {
	t.Helper()
	var pids []int
	for _, f := range names {
		path := filepath.Join(dir, f)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			b, err := os.ReadFile(path)
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
				pids = append(pids, pid)
				t.Cleanup(func() { signalAll([]int{pid}, syscall.SIGKILL) })
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the engine did not write %s", path)
			}
		}
	}
	return pids
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	st, err := ProcStat(pid)
	return err == nil && st.State != 'Z' && st.State != 'X'
}
