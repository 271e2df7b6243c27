//go:build !linux

package pgtest

import "syscall"

// dieWithParent has no parent-death signal to set outside Linux: a test
// killed mid-run may leave its postgres to stop by itself.
func dieWithParent(a *syscall.SysProcAttr) *syscall.SysProcAttr { return a }
