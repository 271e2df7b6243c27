// Package engine is the process side of poold's engines, what the pool
// package needs of the operating system to run them. For now: the listening
// sockets of the host's network namespace and the ones a set of processes
// holds (InspectSockets, Listeners, SocketInodes), by which a ready engine is
// checked to answer on its port alone and nowhere beyond loopback; and the
// trust rule of the state directory, where the engine ledger lives
// (CheckStateDir, CheckFile, ErrUntrusted).
package engine
