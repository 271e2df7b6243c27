package pool

import (
	"errors"
	"fmt"
	"regexp"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
)

// Who listens where, checked once an engine is ready (proc.InspectSockets):
// that the engine itself answers on its port, and where else it listens.

// errPortShared fails the start of an engine whose port another process
// listens on too: with SO_REUSEPORT two servers share a port and the kernel
// splits the connections between them, so the readiness probe may have been
// answered by the other, and requests would be.
var errPortShared = errors.New("another process listens on the engine's port")

// portInUse matches the engine output of a port already taken: Python's
// "[Errno 98] Address already in use" and newer vLLM's "Port N is already in
// use", in any case.
var portInUse = regexp.MustCompile(`(?i)address already in use|port \d+ is already in use`)

// checkSockets checks a ready engine's listening sockets: no other process
// listens on its port, it listens there itself, and nowhere beyond loopback.
// It returns the error that fails the start (errPortShared, or a listener
// beyond loopback on the engine's port unless allowExposed), and a warning
// for lastError: the listeners beyond loopback that do not fail it (on the
// engine's port when allowed; on other ports always, such as the
// rendezvous of a multi-GPU engine's torch.distributed). Sockets that cannot
// be read are logged and pass.
func (p *Pool) checkSockets(e *engine, allowExposed bool) (warning, err error) {
	ls, err := proc.Listeners()
	if err != nil {
		p.log.Warn("cannot read the listening sockets; the engine's port and exposure are not checked", "profile", e.profile.ID, "err", err)
		return nil, nil
	}
	r := proc.InspectSockets(ls, proc.SocketInodes(e.h.Members()), e.port)
	switch {
	case len(r.Foreign) > 0:
		return nil, fmt.Errorf("%w %d (listening on %v): the start is refused, since requests could reach the other", errPortShared, e.port, r.Foreign)
	case !r.Served:
		return nil, fmt.Errorf("%w %d: the engine does not listen on 127.0.0.1:%d itself", errPortShared, e.port, e.port)
	}
	var warnings []error
	if len(r.ExposedPort) > 0 {
		exposed := fmt.Errorf("engine %q listens beyond loopback on %v, where anyone who reaches the host can use it without poold", e.profile.ID, r.ExposedPort)
		if !allowExposed {
			return nil, fmt.Errorf("%w; refused (the pool's allowNonLoopback is false)", exposed)
		}
		warnings = append(warnings, exposed)
	}
	if len(r.ExposedOther) > 0 {
		warnings = append(warnings, fmt.Errorf("engine %q listens beyond loopback on %v besides its port %d", e.profile.ID, r.ExposedOther, e.port))
	}
	if len(warnings) == 0 {
		return nil, nil
	}
	warning = errors.Join(warnings...)
	p.log.Error("engine listens beyond loopback", "profile", e.profile.ID, "pid", e.h.PID(), "err", warning)
	return warning, nil
}

// portTaken reports whether the engine exited because its port was in use.
// Call it once the engine's processes are stopped: it waits (bounded) for
// the engine's last output lines.
func (e *engine) portTaken() bool { return e.printed(notePortTaken) }
