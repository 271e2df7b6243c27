package main

import "syscall"

// procAttr puts a started process in a group of its own that dies with the
// harness, so that a harness killed mid-run leaves nothing behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
