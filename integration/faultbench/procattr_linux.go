package main

import "syscall"

// procAttr has the kernel kill the sidecar if faultbench dies without
// stopping it.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
