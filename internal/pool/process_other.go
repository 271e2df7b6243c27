//go:build !linux

package pool

import (
	"errors"
	"log/slog"
	"os"
	"syscall"
)

// errNotLinux is why engines cannot run here.
var errNotLinux = errors.New("poold runs engines only on Linux: it needs process groups with a parent-death signal and /proc")

// engineProcAttr refuses: see errNotLinux.
func engineProcAttr() (*syscall.SysProcAttr, error) { return nil, errNotLinux }

// processSpawner starts on the calling thread: no engine starts here anyway.
func processSpawner() spawner { return nil }

// leftovers finds no process: no engine ran here.
func leftovers(LedgerEngine) []int { return nil }

// procStat cannot read processes here.
func procStat(int) (stat, error) { return stat{}, errNotLinux }

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

// cgroupAttr is never called: there is no cgroup mode here.
func cgroupAttr(*syscall.SysProcAttr, *os.File) {}

// cgroupProcs finds no process: there are no cgroups here.
func cgroupProcs(string) []int { return nil }

// killCgroup has nothing to kill: there are no cgroups here.
func killCgroup(string) {}

// removeCgroup has nothing to remove: there are no cgroups here.
func removeCgroup(string) error { return nil }

// engineGroups finds none: there are no cgroups here.
func engineGroups(string) []string { return nil }

// RunShim refuses: see errNotLinux.
func RunShim(ShimConfig, *slog.Logger) error { return errNotLinux }
