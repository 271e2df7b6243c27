package pool

import (
	"errors"
	"regexp"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
)

// Who listens where, checked once an engine is ready (proc.CheckSockets),
// and the output of an engine that found its port taken.

// portInUse matches the engine output of a port already taken: Python's
// "[Errno 98] Address already in use" and newer vLLM's "Port N is already in
// use", in any case.
var portInUse = regexp.MustCompile(`(?i)address already in use|port \d+ is already in use`)

// checkSockets checks a ready engine's listening sockets
// (proc.CheckSockets): it returns the error that fails the start and the
// warning for lastError, which it logs; sockets that cannot be read are
// logged and pass.
func (p *Pool) checkSockets(e *engine, allowExposed bool) (warning, err error) {
	warning, err = proc.CheckSockets(e.h, e.profile.ID, allowExposed)
	switch {
	case errors.Is(err, proc.ErrSocketsUnread):
		p.log.Warn("the engine's port and exposure are not checked", "profile", e.profile.ID, "err", err)
		return nil, nil
	case warning != nil:
		p.log.Error("engine listens beyond loopback", "profile", e.profile.ID, "pid", e.h.PID(), "err", warning)
	}
	return warning, err
}

// portTaken reports whether the engine exited because its port was in use.
// Call it once the engine's processes are stopped: it waits (bounded) for
// the engine's last output lines.
func (e *engine) portTaken() bool { return e.printed(notePortTaken) }
