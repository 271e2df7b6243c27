package pool

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/shim"
)

// Engines under a supervisor: with Options.Shims, each engine is started by
// a `poold engine-shim` of its own (RunShim), in a session of its own and
// without a parent-death signal, so that it outlives poold; the shim is the
// engine's parent, and the engine dies with it. poold attaches to the shim
// over a Unix socket in the state directory and gets the engine's output
// and exit through it, and asks it, through the same connection, to stop
// or signal the engine: poold signals no process that a shim holds. A
// poold that stops detaches (Set.Detach) instead of stopping its engines,
// and the next one adopts them (adopt.go).

// Shims is how engines are started under supervisors. A nil *Shims starts
// them as poold's own children, which die with it.
type Shims struct {
	// Dir holds the shims' sockets, and their own logs beside them: the
	// state directory.
	Dir string
	// AdoptTimeout is how long a shim keeps its engine while no poold is
	// attached, from its start and from each poold's going; it must be
	// positive.
	AdoptTimeout time.Duration
}

// shimStartTimeout bounds the wait for a new shim to answer on its socket.
const shimStartTimeout = 30 * time.Second

// shimRequestTimeout bounds a request to a shim, which its loop answers at
// once.
const shimRequestTimeout = 10 * time.Second

// errDetached is the exit of an engine that poold let go of, for the next
// poold to adopt: it still runs.
var errDetached = errors.New("detached: the engine runs on under its supervisor")

// socket is the path of the socket of the shim of the engine with token.
func (s *Shims) socket(token string) string {
	return filepath.Join(s.Dir, "engine-"+strings.ToLower(token[:min(len(token), 12)])+".sock")
}

// command is the shim's command line for an engine run as argv, in the
// cgroup at dir in cgroup mode ("" in process-group mode), whose stop gives
// it grace between SIGTERM and SIGKILL: in a session of its own, so that
// neither poold's signals nor its death reach it.
func (s *Shims) command(self, path, token, fingerprint, cgroup string, grace time.Duration, argv []string) *exec.Cmd {
	args := []string{"engine-shim", "--socket", path, "--adopt-timeout", s.AdoptTimeout.String(),
		"--grace", grace.String(), "--token", token, "--fingerprint", fingerprint}
	if cgroup != "" {
		args = append(args, "--cgroup", cgroup)
	}
	cmd := exec.Command(self, append(append(args, "--"), argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// start starts the shim cmd, serving at path, and attaches to it. The
// shim's own log goes to path+".log".
func (s *Shims) start(cmd *exec.Cmd, path string, spawn proc.Spawner) (*shim.Conn, error) {
	logPath := path + ".log"
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("opening the shim's log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	err = spawn.Start(cmd)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("starting poold engine-shim: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.NewTimer(shimStartTimeout)
	defer deadline.Stop()
	interval := time.Millisecond
	for {
		c, err := shim.Attach(path, shimStartTimeout)
		var se *shim.StartError
		switch {
		case err == nil:
			return c, nil
		case errors.As(err, &se):
			return nil, err
		}
		tick := time.NewTimer(interval)
		select {
		case <-exited:
			tick.Stop()
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("poold engine-shim exited before it served: %s", strings.TrimSpace(string(log)))
		case <-deadline.C:
			tick.Stop()
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("poold engine-shim did not serve within %s: %w", shimStartTimeout, err)
		case <-tick.C:
		}
		interval = min(interval*2, 50*time.Millisecond)
	}
}

// follow returns the engine's output as its shim sends it, and a function
// that waits for its exit: the shim's report of it, or the loss of the
// connection to the shim (errDetached once poold detached). A lost
// connection is logged to log, and the engine is then treated as one that
// exited, with the reason (e.lost is set: stopShimmed asks again through a
// new connection). The hello's backlog goes into the log ring, poold's own
// polls but (pump); the part of it that no poold received is logged as
// well.
func (e *engine) follow(log *slog.Logger) (out io.ReadCloser, wait func() error) {
	r, w := io.Pipe()
	h := e.conn.Hello
	seen := max(0, len(h.Backlog)-h.Unseen)
	for _, line := range h.Backlog[:seen] {
		if !proc.OwnPoll(line) {
			e.noteReason(line)
			e.logs.Add(line)
		}
	}
	wait = func() error {
		defer w.Close()
		for _, line := range h.Backlog[seen:] {
			_, _ = io.WriteString(w, line+"\n")
		}
		for {
			m, err := e.conn.Next()
			switch {
			case e.detached.Load():
				return errDetached
			case err != nil:
				e.lost.Store(true)
				log.Warn("lost the connection to the engine's supervisor; the engine is treated as failed", "shim", e.shimPath, "err", err)
				return fmt.Errorf("its supervisor (poold engine-shim) is gone: %w", err)
			case m.Kind == shim.KindExit:
				e.conn.Close()
				if m.Status == "" {
					return nil
				}
				return errors.New(m.Status)
			}
			_, _ = io.WriteString(w, m.Line+"\n")
		}
	}
	return r, wait
}

// stopShimmed stops e through its shim (shim.OpStop with grace) and waits
// for the shim's report of the exit (stopVia). An engine whose connection
// was lost is stopped through a new one, when its shim still answers. It
// returns nil once the exit is reported, or when the shim is gone: what the
// engine left is then nobody's, and the caller may end it. It returns an
// error when the shim does not report the exit in time, having closed the
// connection (e.exited is then closed).
func (e *engine) stopShimmed(grace time.Duration, log *slog.Logger) error {
	c, exited := e.conn, (<-chan struct{})(e.exited)
	if isClosed(exited) {
		if !e.lost.Load() {
			return nil // the shim reported the exit
		}
		var err error
		if c, exited, err = reattach(e.shimPath, e.pid); err != nil {
			log.Warn("the engine's supervisor is gone; what its engine left is ended by poold", "err", err)
			return nil
		}
		defer c.Close()
		log.Info("attached again to the engine's supervisor to stop it", "shim", e.shimPath)
	}
	return stopVia(c, exited, grace, e.hurry, log)
}

// reattach attaches to the shim at path, which must run the engine pid, and
// returns the connection and a channel closed once the shim reported the
// exit or the connection ended.
func reattach(path string, pid int) (*shim.Conn, <-chan struct{}, error) {
	c, err := shim.Attach(path, adoptTimeout)
	if err != nil {
		return nil, nil, err
	}
	if c.Hello.PID != pid {
		c.Close()
		return nil, nil, fmt.Errorf("its socket's supervisor runs pid %d, not %d", c.Hello.PID, pid)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			if m, err := c.Next(); err != nil || m.Kind == shim.KindExit {
				return
			}
		}
	}()
	return c, exited, nil
}

// stopVia asks the shim attached as c to stop its engine with grace
// (negative: the shim's own, which its hello gives) and waits until exited
// is closed, at most grace and the SIGKILL wait; once hurry is closed (nil
// never is) it asks for SIGKILL. Past the wait it closes c, waits for
// exited, and returns an error.
func stopVia(c *shim.Conn, exited <-chan struct{}, grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	if err := c.Stop(grace, shimRequestTimeout); err != nil {
		log.Warn("asking the engine's supervisor to stop it", "err", err)
	}
	if grace < 0 {
		grace = c.Hello.Grace
	}
	wait := grace + proc.KillWait + outputWait
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-exited:
			return nil
		case <-hurry:
			hurry = nil
			if err := c.Signal(syscall.SIGKILL, shimRequestTimeout); err != nil {
				log.Warn("asking the engine's supervisor to hurry its stop", "err", err)
			}
		case <-t.C:
			c.Close()
			<-exited
			return fmt.Errorf("its supervisor did not report the engine's exit within %s", wait)
		}
	}
}

// StopOrphan stops, through its shim and with grace, the engine that rec
// records when no pool took it (its pool or profile is gone, say, or poold
// stop-engines stops it), so that the reap (proc.Ledger.ReapEngines) finds
// at most what the engine left, held by no shim; it logs to log. A shim
// that does not answer is left to that reap. It is what proc.OpenLedger
// takes as its stopShim.
func StopOrphan(rec proc.LedgerEngine, grace time.Duration, log *slog.Logger) {
	if rec.Shim == "" {
		return
	}
	c, exited, err := reattach(rec.Shim, rec.PID)
	if err != nil {
		return
	}
	defer c.Close()
	log = log.With("pool", rec.Pool, "profile", rec.Profile, "pid", rec.PID)
	log.Info("stopping an engine that no pool takes through its shim", "shim", rec.Shim)
	if err := stopVia(c, exited, grace, nil, log); err != nil {
		log.Error("stopping an engine that no pool takes", "err", err)
	}
}

// detach lets go of a shimmed engine for the next poold to adopt, and
// reports whether it did: an engine without a shim cannot be let go of.
func (e *engine) detach() bool {
	if e.conn == nil {
		return false
	}
	e.unwatchHealth()
	e.detached.Store(true)
	e.conn.Close()
	return true
}

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
