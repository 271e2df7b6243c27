//go:build !linux

package pool

import (
	"errors"
	"syscall"
	"time"
)

// errNotLinux is why engines cannot run here.
var errNotLinux = errors.New("poold runs engines only on Linux: it needs process groups with a parent-death signal and /proc")

// engineProcAttr refuses: see errNotLinux.
func engineProcAttr() (*syscall.SysProcAttr, error) { return nil, errNotLinux }

// processSpawner starts on the calling thread: no engine starts here anyway.
func processSpawner() spawner { return nil }

// waitGroupGone reports the group gone: no engine ran here.
func waitGroupGone(int, time.Duration, <-chan struct{}) bool { return true }

// groupMembers finds no process: no engine ran here.
func groupMembers(int) []int { return nil }

// leftovers finds no process: no engine ran here.
func leftovers(LedgerEngine) []int { return nil }

// procStat cannot read processes here.
func procStat(int) (stat, error) { return stat{}, errNotLinux }

// liveOf finds no process: no engine ran here.
func liveOf([]int) []int { return nil }
