//go:build !linux

package main

import "syscall"

// procAttr puts a started process in a group of its own; outside Linux
// there is no parent-death signal, and a harness killed mid-run may leave
// its processes to be stopped by hand.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
