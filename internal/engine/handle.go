package engine

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"
)

// Handle is one engine process as its Supervisor started or adopted it:
// either poold's own child (Supervisor without Shims), which dies with
// poold, or an engine under a shim of its own (shimmed.go), which outlives
// it. Its methods are safe for concurrent use; Output is read once.
type Handle interface {
	// PID is the engine's pid, also its process group's id.
	PID() int
	// Port is the loopback port it serves on (http://127.0.0.1:port).
	Port() int
	// Exited is closed once the engine exited, or once poold lost or let
	// go of it (Detach); Err is then why: nil for an exit with status 0.
	Exited() <-chan struct{}
	Err() error
	// Output is the engine's output, to read to its end (every writer
	// closed it) and close: the one reader's.
	Output() io.ReadCloser
	// Seen is the output that a previous poold already received (an
	// adopted engine's), poold's own polls left out (OwnPoll); nil for
	// one that this poold started.
	Seen() []string
	// Stop ends every process of the engine: SIGTERM, up to grace for them
	// to end (cut short once hurry is closed; nil never is), then SIGKILL;
	// an engine under a shim is stopped by its shim first, and poold ends
	// only what is left (Tree.End). It returns once no live process of the
	// engine remains and Exited is closed, or with an error naming the
	// survivors; in cgroup mode the cgroup is then removed. It logs to log.
	Stop(grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error
	// Signal sends sig to the engine's processes; through its shim, for
	// an engine under one.
	Signal(sig syscall.Signal) error
	// Members lists the engine's live processes: its cgroup's in cgroup
	// mode, else its process group's and what left it (GroupTree).
	Members() []int
	// Detach lets go of an engine under a shim for the next poold to adopt
	// (Exited then closes), and reports whether it did: a child of
	// poold's own cannot be let go of.
	Detach() bool
	// Record is the engine's process as the ledger records it: its PID,
	// PGID, Port, StartTicks, Token, Cgroup and Shim; the rest is the
	// caller's to fill in.
	Record() LedgerEngine
}

// Supervisor starts engines (Start) and adopts the ones that a previous
// poold left under their shims (Adopt). The zero Supervisor starts each
// engine as poold's own child, from the calling thread, in process-group
// mode. A Supervisor is not changed once in use.
type Supervisor struct {
	// Shims, when set, starts each engine under a shim of its own, which
	// outlives poold; nil starts them as poold's own children.
	Shims *Shims
	// Spawn starts the processes (nil: on the calling thread).
	Spawn Spawner
	// Containment in cgroup mode puts each engine in a cgroup of its own
	// (nil: process-group mode).
	Containment *Containment
	// Self is poold's own executable, which runs the shims.
	Self string
}

// Spec is an engine to start.
type Spec struct {
	// Argv is its command line and Env its environment, without the
	// token; Given is the part of Env that its fingerprint covers with
	// Argv (shim.Fingerprint).
	Argv, Env, Given []string
	// Token marks its processes (TokenEnv).
	Token string
	// Port is the loopback port Argv has it serve on.
	Port int
	// Pool names the pool whose cgroup it starts in, in cgroup mode.
	Pool string
	// Grace is its shim's wait between SIGTERM and SIGKILL when the shim
	// stops it by itself (no poold attached, or a signal to the shim).
	Grace time.Duration
	// Log is where the loss of the connection to its shim is logged, with
	// its pid added; nil logs nothing.
	Log *slog.Logger
}

// Start starts the engine that sp describes, in a cgroup of its own in
// cgroup mode: under a shim of its own with s.Shims, else as poold's own
// child.
func (s *Supervisor) Start(sp Spec) (Handle, error) {
	if sp.Log == nil {
		sp.Log = slog.New(slog.DiscardHandler)
	}
	cgroup, fd, err := s.Containment.NewEngineGroup(sp.Pool, sp.Token)
	if err != nil {
		return nil, err
	}
	if fd != nil {
		defer fd.Close()
	}
	var h Handle
	if s.Shims == nil {
		h, err = s.startChild(sp, cgroup, fd)
	} else {
		h, err = s.startShimmed(sp, cgroup)
	}
	if err != nil && cgroup != "" {
		_ = RemoveCgroup(cgroup)
	}
	return h, err
}

// startChild starts sp as poold's own child, in the cgroup at dir (open
// as fd) in cgroup mode.
func (s *Supervisor) startChild(sp Spec, dir string, fd *os.File) (Handle, error) {
	cmd := exec.Command(sp.Argv[0], sp.Argv[1:]...)
	cmd.Env = append(slices.Clip(sp.Env), TokenEnv+"="+sp.Token)
	var err error
	if cmd.SysProcAttr, err = ProcAttr(); err != nil {
		return nil, err
	}
	if fd != nil {
		UseCgroup(cmd.SysProcAttr, fd)
	}
	out, wait, err := StartChild(cmd, s.Spawn)
	if err != nil {
		return nil, fmt.Errorf("running %q: %w", sp.Argv[0], err)
	}
	c := &child{process: newProcess(cmd.Process.Pid, sp.Port, sp.Token, dir, out)}
	if st, err := ProcStat(c.pid); err == nil {
		c.startTicks = st.Start
	}
	go c.wait(wait)
	return c, nil
}

// process is what both kinds of Handle keep of an engine's process. Its
// fields are set before the Handle is returned and not changed afterwards,
// but err, set once before exited is closed.
type process struct {
	pid, port  int
	token      string
	startTicks uint64 // the leader's start time (Stat.Start); 0 if unknown
	cgroup     string // its own cgroup in cgroup mode; "" in process-group mode
	out        io.ReadCloser
	exited     chan struct{}
	err        error // valid once exited is closed
}

func newProcess(pid, port int, token, cgroup string, out io.ReadCloser) process {
	return process{pid: pid, port: port, token: token, cgroup: cgroup, out: out, exited: make(chan struct{})}
}

// wait records the exit that wait waits for.
func (p *process) wait(wait func() error) {
	p.err = wait()
	close(p.exited)
}

func (p *process) PID() int                { return p.pid }
func (p *process) Port() int               { return p.port }
func (p *process) Exited() <-chan struct{} { return p.exited }
func (p *process) Err() error              { return p.err }
func (p *process) Output() io.ReadCloser   { return p.out }
func (p *process) Members() []int          { return p.tree().Members() }

// tree is what stopping the engine ends.
func (p *process) tree() Tree {
	if p.cgroup != "" {
		return CgroupTree(p.cgroup, p.pid)
	}
	return GroupTree(p.pid, p.token, p.startTicks)
}

// end ends what is left of the engine (Tree.End), waits for its exit, and
// removes its cgroup in cgroup mode.
func (p *process) end(grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	if err := p.tree().End(grace, hurry, log); err != nil {
		return err
	}
	<-p.exited
	if p.cgroup != "" {
		if err := RemoveCgroup(p.cgroup); err != nil {
			log.Warn("removing the engine's cgroup", "cgroup", p.cgroup, "err", err)
		}
	}
	return nil
}

func (p *process) record() LedgerEngine {
	return LedgerEngine{PID: p.pid, PGID: p.pid, Port: p.port, StartTicks: p.startTicks, Token: p.token, Cgroup: p.cgroup}
}

// child is the Handle of an engine that is poold's own child, in a process
// group of its own that dies with poold (ProcAttr).
type child struct{ process }

func (c *child) Seen() []string { return nil }

func (c *child) Stop(grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	return c.end(grace, hurry, log)
}

func (c *child) Signal(sig syscall.Signal) error {
	c.tree().Signal(sig)
	return nil
}

func (c *child) Detach() bool { return false }

func (c *child) Record() LedgerEngine { return c.record() }
