package pool

import (
	"fmt"
	"log/slog"
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
// A nil *Containment is process-group mode. A Containment is immutable.
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
		if err := cgroupTree(dir).end(grace, nil, log); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := removeCgroup(dir); err != nil {
			log.Warn("removing an engine group", "cgroup", dir, "err", err)
		}
	}
	if len(errs) > 0 {
		return pids, fmt.Errorf("engine groups: %v", errs)
	}
	return pids, nil
}

// tree is what a stop ends: an engine's processes, however they are found.
type tree struct {
	what    string       // names it in errors: "cgroup …" or "process group …"
	pgid    int          // signalled as a group as well; 0: none
	members func() []int // the live processes
	// kill is the SIGKILL step; nil sends SIGKILL to the group and the members.
	kill func()
}

// signal sends sig to every member and to the tree's group. The members are
// found first: a process found through its parent is lost once the parent
// has died of the signal.
func (t tree) signal(sig syscall.Signal) {
	members := t.members()
	if t.pgid > 0 {
		_ = syscall.Kill(-t.pgid, sig)
	}
	for _, pid := range members {
		_ = syscall.Kill(pid, sig)
	}
}

// end stops the tree: SIGTERM, up to grace for it to empty (cut short when
// hurry is closed; nil never is), then SIGKILL. It returns only when no live
// process of the tree remains, or with an error naming the survivors.
func (t tree) end(grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	t.signal(syscall.SIGTERM)
	if t.waitEmpty(grace, false, hurry) {
		return nil
	}
	log.Warn("engine did not stop on SIGTERM; sending SIGKILL", "tree", t.what, "grace", grace, "hurried", isClosed(hurry))
	t.sigkill()
	if !t.waitEmpty(killWait, true, nil) {
		return fmt.Errorf("%s still has live processes %v after SIGKILL", t.what, t.members())
	}
	return nil
}

func (t tree) sigkill() {
	if t.kill != nil {
		t.kill()
		return
	}
	t.signal(syscall.SIGKILL)
}

// waitEmpty polls until the tree has no live member, or d passes, or hurry
// is closed (nil: never); with again, it repeats the SIGKILL step each time
// (a process found late, or forked meanwhile, is killed too).
func (t tree) waitEmpty(d time.Duration, again bool, hurry <-chan struct{}) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	start := time.Now()
	for {
		if len(t.members()) == 0 {
			return true
		}
		if again {
			t.sigkill()
		}
		tick := time.NewTimer(pollInterval(time.Since(start), time.Millisecond, 50*time.Millisecond))
		select {
		case <-deadline.C:
			tick.Stop()
			return len(t.members()) == 0
		case <-hurry:
			tick.Stop()
			return len(t.members()) == 0
		case <-tick.C:
		}
	}
}

// cgroupTree is the tree of the engine group at dir.
func cgroupTree(dir string) tree {
	return tree{
		what:    "cgroup " + dir,
		members: func() []int { return cgroupProcs(dir) },
		kill:    func() { killCgroup(dir) },
	}
}
