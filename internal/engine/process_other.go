//go:build !linux

package engine

import (
	"errors"
	"os"
	"syscall"
)

// errNotLinux is why engines cannot run here.
var errNotLinux = errors.New("poold runs engines only on Linux: it needs process groups with a parent-death signal and /proc")

// ProcAttr refuses: see errNotLinux.
func ProcAttr() (*syscall.SysProcAttr, error) { return nil, errNotLinux }

// ProcessSpawner starts on the calling thread: no engine starts here anyway.
func ProcessSpawner() Spawner { return nil }

// leftovers finds no process: no engine ran here.
func leftovers(LedgerEngine) []int { return nil }

// ProcStat cannot read processes here.
func ProcStat(int) (Stat, error) { return Stat{}, errNotLinux }

// procOwner cannot read processes here.
func procOwner(int) (int, int, error) { return 0, 0, errNotLinux }

// liveOf finds no process: no engine ran here.
func liveOf([]int) []int { return nil }

// treeMembers finds no process: no engine ran here.
func treeMembers(int, string, uint64, bool, map[int]uint64) []int { return nil }

// delegatedCgroup refuses: cgroups are Linux's.
func delegatedCgroup() (string, error) { return "", errNotLinux }

// newEngineGroup is never called: there is no cgroup mode here.
func newEngineGroup(string, string, string) (string, *os.File, error) { return "", nil, errNotLinux }

// UseCgroup is never called: there is no cgroup mode here.
func UseCgroup(*syscall.SysProcAttr, *os.File) {}

// cgroupProcs finds no process: there are no cgroups here.
func cgroupProcs(string) []int { return nil }

// killCgroup has nothing to kill: there are no cgroups here.
func killCgroup(string) {}

// RemoveCgroup has nothing to remove: there are no cgroups here.
func RemoveCgroup(string) error { return nil }

// engineGroups finds none: there are no cgroups here.
func engineGroups(string) []string { return nil }
