package engine

import "net/netip"

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
