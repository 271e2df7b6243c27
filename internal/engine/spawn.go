package engine

import (
	"fmt"
	"io"
	"os"
	"os/exec"
)

// TokenEnv names the environment variable that marks an engine's processes:
// its value, a token of the engine's own, is inherited by its descendants and
// tells them from unrelated processes after a crash.
const TokenEnv = "POOLD_ENGINE_TOKEN"

// Spawner starts engine processes from one OS thread that never ends. The
// kernel sends Pdeathsig when the *thread* that forked a child ends, not the
// process (go.dev/issue/27505), and the Go runtime ends a thread whose locked
// goroutine exits (code that calls LockOSThread, as cgo loaders such as NVML's
// do, may leave one); an engine forked on such a thread would be SIGKILLed in
// the middle of its life. A nil Spawner starts on the calling thread. The
// process's one is ProcessSpawner's.
type Spawner chan spawnRequest

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// Start starts cmd (exec.Cmd.Start) on the spawner's thread.
func (s Spawner) Start(cmd *exec.Cmd) error {
	if s == nil {
		return cmd.Start()
	}
	done := make(chan error, 1)
	s <- spawnRequest{cmd, done}
	return <-done
}

// StartChild starts cmd through spawn as the caller's own child, its output
// into a pipe that the caller reads itself (so that waiting for it does not
// wait for grandchildren that inherited the pipe); wait waits for it to exit.
func StartChild(cmd *exec.Cmd, spawn Spawner) (out io.ReadCloser, wait func() error, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("creating log pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = spawn.Start(cmd)
	w.Close()
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, cmd.Wait, nil
}
