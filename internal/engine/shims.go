package engine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/poold/poold/internal/shim"
)

// Shims is how a Supervisor starts engines under shims of their own. A nil
// *Shims starts them as poold's own children, which die with it.
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
func (s *Shims) start(cmd *exec.Cmd, path string, spawn Spawner) (*shim.Conn, error) {
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

// ShimConfig is what `poold engine-shim` is given by the poold that starts
// it (Shims.command).
type ShimConfig struct {
	// Socket is the Unix socket it serves.
	Socket string
	// Token marks the engine's processes (TokenEnv), as for an engine that
	// is poold's own child.
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
