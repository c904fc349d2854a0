package sidecar

import (
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// unreadBytes is how many bytes wait in nc's receive queue (FIONREAD).
func unreadBytes(nc net.Conn) int {
	rc, err := nc.(*net.UnixConn).SyscallConn()
	if err != nil {
		return -1
	}
	var n int32
	_ = rc.Control(func(fd uintptr) {
		_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	})
	return int(n)
}

// settled reports whether c's unread bytes stay at n for a quarter second.
func settled(c *client, n int) bool {
	for i := 0; i < 25; i++ {
		time.Sleep(10 * time.Millisecond)
		if unreadBytes(c.nc) != n {
			return false
		}
	}
	return true
}

// A client that stops reading until its replies fill the socket has
// replies not yet written: the idle timeout leaves it open. Once it reads
// them all and goes quiet, the connection is idle and is closed.
func TestIdleTimeoutSparesUnwrittenReplies(t *testing.T) {
	const idle = 300 * time.Millisecond
	ts := startServer(t, Options{Store: openStore(t, ""), IdleTimeout: idle})
	c := ts.dial(t)
	ping := `{"op":"ping","id":"` + strings.Repeat("x", 100) + `"}`
	// The socket is full once its unread bytes stop growing, checked over a
	// span long enough that a descheduled writer would have written more.
	last := -1
	for sent := 0; ; sent++ {
		if sent > 100_000 {
			t.Fatal("the client's socket never filled")
		}
		c.send(ping)
		time.Sleep(2 * time.Millisecond)
		n := unreadBytes(c.nc)
		if n > 0 && n == last && settled(c, n) {
			break // the writer is blocked on a full socket
		}
		last = n
	}
	time.Sleep(3 * idle) // the clock is the subject: three idle timeouts pass
	if n := metricValue(t, ts.Server, "quotad_connections_idle_closed_total", nil); n != 0 || ts.Conns() != 1 {
		t.Fatalf("with replies unwritten: %v idle closes, %d connections; want 0 and 1", n, ts.Conns())
	}
	// Read every reply: the connection closes once idle.
	_ = c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := io.Copy(io.Discard, c.nc); err != nil {
		t.Fatalf("reading the replies until the sidecar closed the connection: %v", err)
	}
	waitFor(t, "the idle connection to close", func() bool { return ts.Conns() == 0 })
	if n := metricValue(t, ts.Server, "quotad_connections_idle_closed_total", nil); n != 1 {
		t.Fatalf("%v idle closes, want 1", n)
	}
}
