package redistest

import "syscall"

// procAttr makes the kernel kill a redis-server when the process that
// started it dies, even by SIGKILL or a test timeout, where no Cleanup runs.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
