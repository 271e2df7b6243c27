package engine

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/poold/poold/internal/shim"
)

// RunShim is `poold engine-shim`'s work: it starts the engine as its own child,
// in a process group of its own that dies with the shim (Pdeathsig) and, in
// cgroup mode, in the engine's cgroup (the shim itself stays in poold's),
// and supervises it (shim.Serve) until it exits. A SIGTERM, SIGINT or SIGHUP
// stops the engine.
func RunShim(c ShimConfig, log *slog.Logger) error {
	_ = os.Remove(c.Socket) // a socket left by a shim that was killed
	ln, err := net.Listen("unix", c.Socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", c.Socket, err)
	}
	defer os.Remove(c.Socket)
	// Only poold's user may connect, whatever the umask (the next poold
	// refuses a socket that others may write: CheckFile).
	if err := os.Chmod(c.Socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("restricting %s: %w", c.Socket, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env = append(os.Environ(), TokenEnv+"="+c.Token)
	cmd.SysProcAttr, _ = ProcAttr()
	if c.Cgroup != "" {
		fd, err := os.Open(c.Cgroup)
		if err != nil {
			err = fmt.Errorf("opening the engine's cgroup: %w", err)
			log.Error("the engine could not start", "err", err)
			return shim.Fail(ln, err, c.AdoptTimeout)
		}
		defer fd.Close()
		UseCgroup(cmd.SysProcAttr, fd)
	}
	out, wait, err := StartChild(cmd, ProcessSpawner())
	if err != nil {
		err = fmt.Errorf("running %q: %w", c.Argv[0], err)
		log.Error("the engine could not start", "err", err)
		return shim.Fail(ln, err, c.AdoptTimeout)
	}
	pid := cmd.Process.Pid
	var start uint64
	if st, err := ProcStat(pid); err == nil {
		start = st.Start
	}
	t := GroupTree(pid, c.Token, start)
	if c.Cgroup != "" {
		t = CgroupTree(c.Cgroup, pid)
	}
	eng := &shimmedEngine{wait: wait, log: log, tree: t}
	log.Info("engine started", "pid", pid, "cgroup", c.Cgroup)
	err = shim.Serve(ctx, ln, pid, eng, out, shim.Options{AdoptTimeout: c.AdoptTimeout, Grace: c.Grace, Fingerprint: c.Fingerprint, Log: log})
	log.Info("shim exiting", "engine_exit", err)
	return nil
}

// shimmedEngine is the engine as the shim sees it (shim.Engine).
type shimmedEngine struct {
	wait func() error
	tree Tree
	log  *slog.Logger
}

func (e *shimmedEngine) Wait() error { return e.wait() }

func (e *shimmedEngine) Stop(grace time.Duration) error { return e.tree.End(grace, nil, e.log) }

func (e *shimmedEngine) Signal(sig syscall.Signal) error {
	e.log.Info("signalling the engine", "signal", sig)
	e.tree.Signal(sig)
	return nil
}
