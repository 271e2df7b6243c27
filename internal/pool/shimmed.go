package pool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/poold/poold/internal/shim"
)

// Engines under a supervisor: with Options.Shims, each engine is started by
// a `poold engine-shim` of its own (RunShim), in a session of its own and
// without a parent-death signal, so that it outlives poold; the shim is the
// engine's parent, and the engine dies with it. poold attaches to the shim
// over a Unix socket in the state directory and gets the engine's output
// and exit through it; a poold that stops detaches (Set.Detach) instead of
// stopping its engines, and the next one adopts them (adopt.go).

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

// errDetached is the exit of an engine that poold let go of, for the next
// poold to adopt: it still runs.
var errDetached = errors.New("detached: the engine runs on under its supervisor")

// socket is the path of the socket of the shim of the engine with token.
func (s *Shims) socket(token string) string {
	return filepath.Join(s.Dir, "engine-"+strings.ToLower(token[:min(len(token), 12)])+".sock")
}

// command is the shim's command line for an engine run as argv, whose stop
// gives it grace between SIGTERM and SIGKILL: in a session of its own, so
// that neither poold's signals nor its death reach it.
func (s *Shims) command(self, path, token, fingerprint string, grace time.Duration, argv []string) *exec.Cmd {
	args := []string{"engine-shim", "--socket", path, "--adopt-timeout", s.AdoptTimeout.String(),
		"--grace", grace.String(), "--token", token, "--fingerprint", fingerprint, "--"}
	cmd := exec.Command(self, append(args, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// start starts the shim cmd, serving at path, and attaches to it. The
// shim's own log goes to path+".log".
func (s *Shims) start(cmd *exec.Cmd, path string, spawn spawner) (*shim.Conn, error) {
	logPath := path + ".log"
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("opening the shim's log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	err = spawn.start(cmd)
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
// that waits for its exit: the shim's report of it, or the loss of the shim
// (errDetached once poold detached). The hello's backlog goes into the log
// ring, poold's own polls but (pump); the part of it that no poold received
// is logged as well.
func (e *engine) follow() (out io.ReadCloser, wait func() error) {
	r, w := io.Pipe()
	h := e.conn.Hello
	seen := max(0, len(h.Backlog)-h.Unseen)
	for _, line := range h.Backlog[:seen] {
		if !ownPoll(line) {
			e.noteReason(line)
			e.logs.add(line)
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

// removeShimFiles removes the socket and the log of a shim whose engine is
// gone; "" is none.
func removeShimFiles(path string) {
	if path != "" {
		_ = os.Remove(path)
		_ = os.Remove(path + ".log")
	}
}
