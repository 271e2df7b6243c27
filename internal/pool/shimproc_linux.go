package pool

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
	// AdoptTimeout is shim.Options'; Grace is the stop's wait between
	// SIGTERM and SIGKILL.
	AdoptTimeout, Grace time.Duration
	// Argv is the engine's command line; its environment is the shim's,
	// and the token.
	Argv []string
}

// RunShim is `poold engine-shim`'s work: it starts the engine as its own child,
// in a process group of its own that dies with the shim (Pdeathsig), and
// supervises it (shim.Serve) until it exits. A SIGTERM, SIGINT or SIGHUP
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
	eng := &shimmedEngine{wait: wait, grace: c.Grace, log: log, tree: groupTree(pid, c.Token, start)}
	log.Info("engine started", "pid", pid)
	err = shim.Serve(ctx, ln, pid, eng, out, shim.Options{AdoptTimeout: c.AdoptTimeout, Fingerprint: c.Fingerprint, Log: log})
	log.Info("shim exiting", "engine_exit", err)
	return nil
}

// shimmedEngine is the engine as the shim sees it (shim.Engine).
type shimmedEngine struct {
	wait  func() error
	tree  tree
	grace time.Duration
	log   *slog.Logger
}

func (e *shimmedEngine) Wait() error { return e.wait() }

func (e *shimmedEngine) Stop() error { return e.tree.end(e.grace, nil, e.log) }
