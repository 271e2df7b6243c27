// Package engine is the process side of poold's engines, what the pool
// package needs of the operating system to run them: the engine process
// itself, a Handle that a Supervisor starts or adopts, either poold's own
// child or an engine under a shim of its own (Shims, Shimmed, and the
// shim's end, RunShim), through which the pool reads its output and exit,
// stops or signals it, lists its members and detaches it; their
// containment, a cgroup v2 group or a process group each (Containment),
// and the stop of an engine's process tree (Tree); the one thread engines
// are forked from (Spawner), their process attributes and the /proc scans
// that find their processes (ProcStat); what poold keeps of an engine's
// output as it reads it (Output, OwnPoll); the engines ledger in the state
// directory, which a crash's successor reaps (Ledger, and StopOrphan for
// an engine under a shim that no pool takes), and that directory's trust
// rule (CheckStateDir, CheckFile, ErrUntrusted); the listening sockets of
// the host's network namespace and the ones a set of processes holds
// (InspectSockets, Listeners, SocketInodes), by which a ready engine is
// checked to answer on its port alone and nowhere beyond loopback
// (CheckSockets); the engine's HTTP API as poold calls it (API: its
// probes, sleep, wake and warm-up); and the checks of an engine that a
// previous poold left under its shim before it is adopted
// (Shimmed.Verify).
package engine
