// Package engine is the process side of poold's engines, what the pool
// package needs of the operating system to run them: for now, the listening
// sockets of the host's network namespace and the ones a set of processes
// holds (InspectSockets, Listeners, SocketInodes), by which a ready engine is
// checked to answer on its port alone and nowhere beyond loopback.
package engine
