package pool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Linux process mechanics: engines in process groups with Pdeathsig, forked
// from one long-lived thread, and /proc scans of groups and processes.

// engineProcAttr puts an engine in its own process group, so that stop can
// signal its whole tree, with SIGKILL as its parent-death signal, so that no
// engine outlives its daemon.
func engineProcAttr() (*syscall.SysProcAttr, error) {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}, nil
}

// processSpawner is the process's one spawner, started on first use. It lives
// as long as the process, because it must outlive every engine it started.
var processSpawner = sync.OnceValue(newSpawner)

// newSpawner starts the spawning goroutine, locked to its thread.
func newSpawner() spawner {
	s := make(spawner)
	go func() {
		runtime.LockOSThread()
		for r := range s {
			r.done <- r.cmd.Start()
		}
	}()
	return s
}

// waitGroupGone polls until process group pgid has no live member, or d
// passes, or hurry is closed (nil: never).
func waitGroupGone(pgid int, d time.Duration, hurry <-chan struct{}) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	interval := time.Millisecond
	for {
		if len(groupMembers(pgid)) == 0 {
			return true
		}
		t := time.NewTimer(interval)
		select {
		case <-deadline.C:
			t.Stop()
			return len(groupMembers(pgid)) == 0
		case <-hurry:
			t.Stop()
			return len(groupMembers(pgid)) == 0
		case <-t.C:
		}
		interval = min(interval*2, 50*time.Millisecond)
	}
}

// groupMembers lists the live (not zombie) processes whose process group is
// pgid, from /proc.
func groupMembers(pgid int) []int {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command, which is in parentheses and may hold anything:
		// state ppid pgrp ...
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// leftovers lists the live processes that still belong to recorded engine e.
func leftovers(e LedgerEngine) []int {
	var out []int
	marker := []byte(tokenEnv + "=" + e.Token + "\x00")
	for _, pid := range groupMembers(e.PGID) {
		st, err := procStat(pid)
		if err != nil || st.pgid != e.PGID || st.start < e.StartTicks {
			continue
		}
		env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil || e.Token == "" || !(bytes.HasPrefix(env, marker) || bytes.Contains(env, append([]byte{0}, marker...))) {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// procStat reads /proc/PID/stat.
func procStat(pid int) (stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	// The command, in parentheses, may hold anything: fields start after it
	// at field 3 (state); pgrp is field 5 and starttime field 22.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return stat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	pgid, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return stat{state: f[0][0], pgid: pgid, start: start}, nil
}

// liveOf returns the pids that are still live (not zombies).
func liveOf(pids []int) []int {
	var live []int
	for _, pid := range pids {
		if st, err := procStat(pid); err == nil && st.state != 'Z' && st.state != 'X' {
			live = append(live, pid)
		}
	}
	return live
}
