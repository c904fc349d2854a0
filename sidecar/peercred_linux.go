package sidecar

import (
	"net"
	"syscall"
)

// peerPID is the pid of the process that connected nc, as SO_PEERCRED
// reports it in this process's pid namespace: 0 when the peer is in a
// namespace this one cannot see (another container of a pod that does not
// share its process namespace), or when nc is not a Unix socket.
func peerPID(nc net.Conn) int32 {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int32
	_ = rc.Control(func(fd uintptr) {
		if cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED); err == nil {
			pid = cred.Pid
		}
	})
	return pid
}
