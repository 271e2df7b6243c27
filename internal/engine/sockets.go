package engine

import (
	"errors"
	"fmt"
	"net/netip"
)

// Who listens where, checked once an engine is ready: that the engine itself
// answers on its port, and where else it listens.

// Listener is one listening TCP socket, from the kernel's socket
// diagnostics or /proc/net/tcp{,6} (Listeners).
type Listener struct {
	Addr  netip.AddrPort
	Inode uint64 // the socket's, as its holders' /proc/PID/fd links name it
}

// SocketReport is what the listening sockets say of a ready engine on port.
type SocketReport struct {
	// Foreign are other processes' listeners that take connections to
	// 127.0.0.1:port.
	Foreign []netip.AddrPort
	// Served reports that the engine itself has such a listener.
	Served bool
	// ExposedPort and ExposedOther are the engine's listeners beyond
	// loopback, on its port and on others.
	ExposedPort, ExposedOther []netip.AddrPort
}

// InspectSockets reads ls, every listening socket of the host's namespace,
// for the engine holding the socket inodes own and serving port.
func InspectSockets(ls []Listener, own map[uint64]bool, port int) SocketReport {
	var r SocketReport
	for _, l := range ls {
		a := l.Addr.Addr().Unmap()
		onPort := int(l.Addr.Port()) == port
		takesLoopback := onPort && (a.IsUnspecified() || a == netip.AddrFrom4([4]byte{127, 0, 0, 1}))
		switch {
		case !own[l.Inode]:
			if takesLoopback {
				r.Foreign = append(r.Foreign, l.Addr)
			}
		case a.IsLoopback():
			r.Served = r.Served || takesLoopback
		case onPort:
			r.Served = r.Served || takesLoopback
			r.ExposedPort = append(r.ExposedPort, l.Addr)
		default:
			r.ExposedOther = append(r.ExposedOther, l.Addr)
		}
	}
	return r
}

// ErrPortShared fails the start of an engine whose port another process
// listens on too: with SO_REUSEPORT two servers share a port and the kernel
// splits the connections between them, so the readiness probe may have been
// answered by the other, and requests would be.
var ErrPortShared = errors.New("another process listens on the engine's port")

// ErrSocketsUnread wraps why CheckSockets could not read the host's
// listening sockets: the engine's port and exposure are then unchecked.
var ErrSocketsUnread = errors.New("cannot read the listening sockets")

// CheckSockets checks the listening sockets of h, a ready engine of the
// profile id: no other process listens on its port, it listens there
// itself, and nowhere beyond loopback. It returns the error that fails the
// start (ErrPortShared, or a listener beyond loopback on the engine's port
// unless allowExposed, or ErrSocketsUnread, which the caller may let pass),
// and a warning for the pool's lastError: the listeners beyond loopback
// that do not fail it (on the engine's port when allowed; on other ports
// always, such as the rendezvous of a multi-GPU engine's
// torch.distributed).
func CheckSockets(h Handle, id string, allowExposed bool) (warning, err error) {
	ls, err := Listeners()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSocketsUnread, err)
	}
	port := h.Port()
	r := InspectSockets(ls, SocketInodes(h.Members()), port)
	switch {
	case len(r.Foreign) > 0:
		return nil, fmt.Errorf("%w %d (listening on %v): the start is refused, since requests could reach the other", ErrPortShared, port, r.Foreign)
	case !r.Served:
		return nil, fmt.Errorf("%w %d: the engine does not listen on 127.0.0.1:%d itself", ErrPortShared, port, port)
	}
	var warnings []error
	if len(r.ExposedPort) > 0 {
		exposed := fmt.Errorf("engine %q listens beyond loopback on %v, where anyone who reaches the host can use it without poold", id, r.ExposedPort)
		if !allowExposed {
			return nil, fmt.Errorf("%w; refused (the pool's allowNonLoopback is false)", exposed)
		}
		warnings = append(warnings, exposed)
	}
	if len(r.ExposedOther) > 0 {
		warnings = append(warnings, fmt.Errorf("engine %q listens beyond loopback on %v besides its port %d", id, r.ExposedOther, port))
	}
	return errors.Join(warnings...), nil
}
