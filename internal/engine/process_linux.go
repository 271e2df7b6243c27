package engine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Linux process mechanics: engines in process groups with Pdeathsig, forked
// from one long-lived thread, and /proc scans of groups and processes.

// ProcAttr puts an engine in its own process group, so that a stop can
// signal its whole tree, with SIGKILL as its parent-death signal, so that no
// engine outlives its daemon. It fails where engines cannot run (not Linux).
func ProcAttr() (*syscall.SysProcAttr, error) {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}, nil
}

// ProcessSpawner returns the process's one Spawner, started on first use. It
// lives as long as the process, because it must outlive every engine it
// started.
var ProcessSpawner = sync.OnceValue(newSpawner)

// newSpawner starts the spawning goroutine, locked to its thread.
func newSpawner() Spawner {
	s := make(Spawner)
	go func() {
		runtime.LockOSThread()
		for r := range s {
			r.done <- r.cmd.Start()
		}
	}()
	return s
}

// treeMembers lists, from one scan of /proc, the live processes of an engine
// in process-group mode: the members of its process group pgid (when group is
// set), the processes started no earlier than its leader (start, in clock
// ticks after boot) whose environment carries its token, the processes in
// known (pid → start time, those found before) that still run, and the
// descendants of all of those; it adds what it finds to known, when not nil.
// A process that left the group (setsid) is found by its token or its parent;
// one that also cleared its environment (env -i) only while its parent lives,
// or once found, through known.
func treeMembers(pgid int, token string, start uint64, group bool, known map[int]uint64) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	marker := []byte(TokenEnv + "=" + token + "\x00")
	in := make(map[int]bool)
	children := make(map[int][]int)
	starts := make(map[int]uint64) // of every live process
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		st, err := ProcStat(pid)
		if err != nil || st.State == 'Z' || st.State == 'X' {
			continue
		}
		children[st.PPID] = append(children[st.PPID], pid)
		starts[pid] = st.Start
		switch was, ok := known[pid]; {
		case ok && was == st.Start:
			in[pid] = true
		case group && st.PGID == pgid && st.Start >= start:
			in[pid] = true
		case token != "" && st.Start >= start:
			env, err := os.ReadFile("/proc/" + ent.Name() + "/environ")
			if err == nil && (bytes.HasPrefix(env, marker) || bytes.Contains(env, append([]byte{0}, marker...))) {
				in[pid] = true
			}
		}
	}
	queue := make([]int, 0, len(in))
	for pid := range in {
		queue = append(queue, pid)
	}
	for len(queue) > 0 {
		pid := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		for _, c := range children[pid] {
			if !in[c] {
				in[c] = true
				queue = append(queue, c)
			}
		}
	}
	pids := make([]int, 0, len(in))
	for pid := range in {
		pids = append(pids, pid)
		if known != nil {
			known[pid] = starts[pid]
		}
	}
	slices.Sort(pids)
	return pids
}

// leftovers lists the live processes that still belong to recorded engine e
// (process-group mode): as treeMembers finds them, but the process group only
// while its number still is the engine's. A process group's number stays
// taken while any member lives, so a live process in it that started after
// the engine is the engine's, unless the whole group ended and the number
// came round again for a new leader: then the leader's pid is alive with
// another start time, and only the token counts.
func leftovers(e LedgerEngine) []int {
	group := true
	if st, err := ProcStat(e.PGID); err == nil && st.Start != e.StartTicks {
		group = false
	}
	if e.Token == "" && !group {
		return nil
	}
	return treeMembers(e.PGID, e.Token, e.StartTicks, group, nil)
}

// ProcStat reads /proc/PID/stat: an error where pid is no process, or
// processes cannot be read (not Linux).
func ProcStat(pid int) (Stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	// The command, in parentheses, may hold anything: fields start after it
	// at field 3 (state); ppid is field 4, pgrp field 5 and starttime field 22.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ppid, err0 := strconv.Atoi(f[1])
	pgid, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err := errors.Join(err0, err1, err2); err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return Stat{State: f[0][0], PPID: ppid, PGID: pgid, Start: start}, nil
}

// procOwner reads the real and effective uid of process pid from
// /proc/PID/status.
func procOwner(pid int) (real, effective int, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(data)) {
		if ids, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(ids)
			if len(f) < 2 {
				break
			}
			real, err0 := strconv.Atoi(f[0])
			effective, err1 := strconv.Atoi(f[1])
			if err := errors.Join(err0, err1); err != nil {
				return 0, 0, fmt.Errorf("/proc/%d/status: %w", pid, err)
			}
			return real, effective, nil
		}
	}
	return 0, 0, fmt.Errorf("/proc/%d/status: no Uid line", pid)
}

// liveOf returns the pids that are still live (not zombies).
func liveOf(pids []int) []int {
	var live []int
	for _, pid := range pids {
		if st, err := ProcStat(pid); err == nil && st.State != 'Z' && st.State != 'X' {
			live = append(live, pid)
		}
	}
	return live
}
