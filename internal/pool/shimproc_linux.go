package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/shim"
)

// ShimConfig is what `poold engine-shim` is given by the poold that starts
// it (Shims.command).
type ShimConfig struct {
	// Socket is the Unix socket it serves.
	Socket string
	// Token marks the engine's processes (POOLD_ENGINE_TOKEN), as for an
	// engine that is poold's own child.
	Token string
	// Fingerprint is sent in the hello (shim.Message).
	Fingerprint string
	// Cgroup is the engine's own cgroup in cgroup mode, which the engine
	// starts in and the shim stays out of; "" in process-group mode.
	Cgroup string
	// AdoptTimeout is shim.Options'; Grace is the stop's wait between
	// SIGTERM and SIGKILL.
	AdoptTimeout, Grace time.Duration
	// Argv is the engine's command line; its environment is the shim's,
	// and the token.
	Argv []string
}

// ShimMain is `poold engine-shim`, an engine's supervisor, which poold runs
// itself for each engine with Shims (Shims.command): it parses args into a
// ShimConfig and runs RunShim, logging to stderr (which poold points to a
// file beside the socket).
func ShimMain(args []string, stdout, stderr io.Writer) int {
	const usage = "--socket PATH --token TOKEN --adopt-timeout D [flags] -- COMMAND [ARG...]"
	fl := cli.NewFlagSet("poold engine-shim")
	var c ShimConfig
	fl.StringVar(&c.Socket, "socket", "", "the Unix socket to serve")
	fl.StringVar(&c.Token, "token", "", "the token that marks the engine's processes")
	fl.StringVar(&c.Fingerprint, "fingerprint", "", "the fingerprint of the engine's command and environment, for the hello")
	fl.StringVar(&c.Cgroup, "cgroup", "", "the engine's own cgroup, to start it in (cgroup mode)")
	fl.DurationVar(&c.AdoptTimeout, "adopt-timeout", time.Minute, "how long the engine runs on with no poold attached")
	fl.DurationVar(&c.Grace, "grace", 90*time.Second, "the engine's stop: the wait between SIGTERM and SIGKILL")
	if code, ok := cli.ParseFlags(fl, usage, args, stdout, stderr); !ok {
		return code
	}
	c.Argv = fl.Args()
	switch {
	case c.Socket == "" || c.Token == "":
		return cli.UsageError(stderr, fl, usage, errors.New("--socket and --token are required"))
	case c.AdoptTimeout <= 0:
		return cli.UsageError(stderr, fl, usage, errors.New("--adopt-timeout must be positive"))
	case len(c.Argv) == 0:
		return cli.UsageError(stderr, fl, usage, errors.New("no engine command"))
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("component", "engine-shim", "socket", c.Socket)
	if err := RunShim(c, log); err != nil {
		log.Error("engine-shim", "err", err)
		return cli.ExitFailure
	}
	return cli.ExitOK
}

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
	// refuses a socket that others may write: statedir.go).
	if err := os.Chmod(c.Socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("restricting %s: %w", c.Socket, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env = append(os.Environ(), tokenEnv+"="+c.Token)
	cmd.SysProcAttr, _ = engineProcAttr()
	if c.Cgroup != "" {
		fd, err := os.Open(c.Cgroup)
		if err != nil {
			err = fmt.Errorf("opening the engine's cgroup: %w", err)
			log.Error("the engine could not start", "err", err)
			return shim.Fail(ln, err, c.AdoptTimeout)
		}
		defer fd.Close()
		cgroupAttr(cmd.SysProcAttr, fd)
	}
	out, wait, err := startChild(cmd, processSpawner())
	if err != nil {
		err = fmt.Errorf("running %q: %w", c.Argv[0], err)
		log.Error("the engine could not start", "err", err)
		return shim.Fail(ln, err, c.AdoptTimeout)
	}
	pid := cmd.Process.Pid
	var start uint64
	if st, err := procStat(pid); err == nil {
		start = st.start
	}
	t := groupTree(pid, c.Token, start)
	if c.Cgroup != "" {
		t = cgroupTree(c.Cgroup)
		t.pgid = pid
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
	tree tree
	log  *slog.Logger
}

func (e *shimmedEngine) Wait() error { return e.wait() }

func (e *shimmedEngine) Stop(grace time.Duration) error { return e.tree.end(grace, nil, e.log) }

func (e *shimmedEngine) Signal(sig syscall.Signal) error {
	e.log.Info("signalling the engine", "signal", sig)
	e.tree.signal(sig)
	return nil
}
