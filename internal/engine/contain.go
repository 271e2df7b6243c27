package engine

import (
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// The containment modes (Containment).
const (
	ModeCgroup       = "cgroup"
	ModeProcessGroup = "process-group"
	// ModeAuto chooses cgroup mode where a delegated cgroup is writable.
	ModeAuto = "auto"
)

// Containment is how poold keeps account of its engines' processes, so that
// a stop ends every one of them.
//
// In cgroup mode each engine runs in a cgroup v2 group of its own, created
// under the cgroup delegated to poold (systemd's Delegate=yes), while poold
// itself runs in a leaf beside them. Whatever an engine's processes do
// (setsid, a new environment) they stay in its group: a stop is over when
// the group is empty, and its SIGKILL step is the group's cgroup.kill.
//
// In process-group mode (no writable delegated cgroup: a container, no
// systemd) each engine is a process group, and a stop also ends what left
// the group: processes carrying the engine's token in their environment, and
// the descendants of every process found. docs/security.md says what that
// cannot find.
//
// A nil *Containment is process-group mode, and so is the zero Containment.
// A Containment is immutable.
type Containment struct {
	// base is the delegated cgroup's directory, under which each engine gets
	// its group; "" in process-group mode.
	base string
	// reason is why process-group mode was chosen.
	reason string
}

// NewContainment sets up mode: ModeCgroup (an error if no delegated cgroup
// is writable), ModeProcessGroup, or ModeAuto (cgroup mode where possible,
// else process-group mode with the reason). In cgroup mode poold moves
// itself into the leaf "supervisor" of its cgroup (see delegatedCgroup).
func NewContainment(mode string) (*Containment, error) {
	switch mode {
	case ModeProcessGroup:
		return &Containment{reason: "containment is set to process-group"}, nil
	case ModeCgroup, ModeAuto:
	default:
		return nil, fmt.Errorf("containment: %q is not auto, cgroup or process-group", mode)
	}
	base, err := delegatedCgroup()
	switch {
	case err == nil:
		return &Containment{base: base}, nil
	case mode == ModeCgroup:
		return nil, fmt.Errorf("containment: %w", err)
	}
	return &Containment{reason: err.Error()}, nil
}

// Mode is ModeCgroup or ModeProcessGroup.
func (c *Containment) Mode() string {
	if c == nil || c.base == "" {
		return ModeProcessGroup
	}
	return ModeCgroup
}

// NewEngineGroup creates the cgroup of a new engine of pool, marked with
// token, and opens it for the engine to start in (UseCgroup): in cgroup mode.
// In process-group mode it returns "" and a nil file.
func (c *Containment) NewEngineGroup(pool, token string) (dir string, fd *os.File, err error) {
	if c.Mode() != ModeCgroup {
		return "", nil, nil
	}
	return newEngineGroup(c.base, pool, token)
}

// Status is the containment's part of /status.
func (c *Containment) Status() statusapi.Containment {
	switch {
	case c == nil:
		return statusapi.Containment{Mode: ModeProcessGroup, Reason: "no containment configured"}
	case c.base == "":
		return statusapi.Containment{Mode: ModeProcessGroup, Reason: c.reason}
	}
	return statusapi.Containment{Mode: ModeCgroup, Cgroup: c.base}
}

// Reap ends every engine group left under the delegated cgroup (cgroup mode;
// process-group mode has nothing to look at), each as a stop would, and
// removes the groups. The ledger reaps what it recorded first; this finds
// what a crash left before its record was written. It leaves the groups in
// keep (the engines adopted) alone, and returns the processes it ended.
func (c *Containment) Reap(grace time.Duration, keep map[string]bool, log *slog.Logger) ([]int, error) {
	if c.Mode() != ModeCgroup {
		return nil, nil
	}
	var pids []int
	var errs []error
	for _, dir := range engineGroups(c.base) {
		if keep[dir] {
			continue
		}
		left := cgroupProcs(dir)
		if len(left) > 0 {
			log.Warn("stopping an engine group left by a previous poold", "cgroup", dir, "pids", left)
		}
		pids = append(pids, left...)
		if err := CgroupTree(dir, 0).End(grace, nil, log); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := RemoveCgroup(dir); err != nil {
			log.Warn("removing an engine group", "cgroup", dir, "err", err)
		}
	}
	if len(errs) > 0 {
		return pids, fmt.Errorf("engine groups: %v", errs)
	}
	return pids, nil
}

// KillWait bounds the wait for a SIGKILLed engine's processes to vanish.
const KillWait = 10 * time.Second

// Tree is what a stop ends: an engine's processes, however they are found
// (CgroupTree, GroupTree). The zero Tree has no members and signals nothing.
type Tree struct {
	what    string       // names it in errors: "cgroup …" or "process group …"
	pgid    int          // signalled as a group as well; 0: none
	members func() []int // the live processes; nil: none
	// kill is the SIGKILL step; nil sends SIGKILL to the group and the members.
	kill func()
}

// CgroupTree is the tree of the engine group at dir; pgid, when not 0, is
// the engine's process group, signalled as a group as well.
func CgroupTree(dir string, pgid int) Tree {
	return Tree{
		what:    "cgroup " + dir,
		pgid:    pgid,
		members: func() []int { return cgroupProcs(dir) },
		kill:    func() { killCgroup(dir) },
	}
}

// GroupTree is the tree of an engine in process-group mode whose leader is
// pid, started at start (clock ticks after boot, Stat.Start), marked with
// token (TokenEnv): the members of its process group, the processes that
// carry its token, and their descendants (see treeMembers).
func GroupTree(pid int, token string, start uint64) Tree {
	// What one scan found stays the engine's while it runs: a process whose
	// parent died meanwhile (SIGTERMed first, say) is still known.
	known := make(map[int]uint64)
	return Tree{
		what:    fmt.Sprintf("process group %d", pid),
		pgid:    pid,
		members: func() []int { return treeMembers(pid, token, start, true, known) },
	}
}

// Members lists the tree's live processes.
func (t Tree) Members() []int {
	if t.members == nil {
		return nil
	}
	return t.members()
}

// Signal sends sig to every member and to the tree's group. The members are
// found first: a process found through its parent is lost once the parent
// has died of the signal.
func (t Tree) Signal(sig syscall.Signal) {
	members := t.Members()
	if t.pgid > 0 {
		_ = syscall.Kill(-t.pgid, sig)
	}
	for _, pid := range members {
		_ = syscall.Kill(pid, sig)
	}
}

// End stops the tree: SIGTERM, up to grace for it to empty (cut short when
// hurry is closed; nil never is), then SIGKILL. It returns only when no live
// process of the tree remains, or with an error naming the survivors.
func (t Tree) End(grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	t.Signal(syscall.SIGTERM)
	if t.waitEmpty(grace, false, hurry) {
		return nil
	}
	log.Warn("engine did not stop on SIGTERM; sending SIGKILL", "tree", t.what, "grace", grace, "hurried", isClosed(hurry))
	t.sigkill()
	if !t.waitEmpty(KillWait, true, nil) {
		return fmt.Errorf("%s still has live processes %v after SIGKILL", t.what, t.Members())
	}
	return nil
}

func (t Tree) sigkill() {
	if t.kill != nil {
		t.kill()
		return
	}
	t.Signal(syscall.SIGKILL)
}

// waitEmpty polls until the tree has no live member, or d passes, or hurry
// is closed (nil: never); with again, it repeats the SIGKILL step each time
// (a process found late, or forked meanwhile, is killed too).
func (t Tree) waitEmpty(d time.Duration, again bool, hurry <-chan struct{}) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	start := time.Now()
	for {
		if len(t.Members()) == 0 {
			return true
		}
		if again {
			t.sigkill()
		}
		tick := time.NewTimer(PollInterval(time.Since(start), time.Millisecond, 50*time.Millisecond))
		select {
		case <-deadline.C:
			tick.Stop()
			return len(t.Members()) == 0
		case <-hurry:
			tick.Stop()
			return len(t.Members()) == 0
		case <-tick.C:
		}
	}
}

// PollInterval is the wait before the next look at something that has
// taken elapsed so far: a tenth of it, within [lo, hi]. A wait polled so
// ends at most about a tenth (or lo) after what it waits for, where
// intervals that double could add as much again.
func PollInterval(elapsed, lo, hi time.Duration) time.Duration {
	return min(max(elapsed/10, lo), hi)
}

// isClosed reports whether c is closed; a nil c never is.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
