//go:build !linux

package engine

import "errors"

// errNoSockets is why sockets cannot be read here.
var errNoSockets = errors.New("listening sockets are read only on Linux (/proc, NETLINK_SOCK_DIAG)")

// Listeners cannot read sockets here.
func Listeners() ([]Listener, error) { return nil, errNoSockets }

// SocketInodes finds none: no engine ran here.
func SocketInodes([]int) map[uint64]bool { return nil }
