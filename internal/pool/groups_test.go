package pool

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process-group helpers of the tests: what is left of an engine's group.

// waitGroupGone polls until process group pgid has no live member, or d passes.
func waitGroupGone(pgid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	interval := time.Millisecond
	for {
		if len(groupMembers(pgid)) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
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
