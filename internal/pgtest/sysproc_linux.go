package pgtest

import "syscall"

// dieWithParent makes the server's processes die with the test binary, so
// that a test killed mid-run leaves no postgres behind.
func dieWithParent(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	a.Pdeathsig = syscall.SIGKILL
	return a
}
