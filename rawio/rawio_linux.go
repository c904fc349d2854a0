//go:build linux && !norawio

// Package rawio reads and writes sockets with raw system calls on Linux.
// It is the only place quotad bypasses net.Conn's Read and Write, and it
// must keep paying for itself: build with -tags norawio for plain
// net.Conn I/O, and compare the two with make bench
// (docs/performance.md). On other systems, and under norawio, Wrap and Dialer hand
// back plain connections.
package rawio

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"syscall"
	"unsafe"
)

// rawIO reads and writes a connected non-blocking socket with raw system
// calls. read(2) and write(2) on a non-blocking socket return at once, so
// they need not go through the runtime's entersyscall and exitsyscall. Those
// matter here: a system call made through them while every processor is
// idle wakes the runtime's monitor thread, which then polls every 20 µs for
// the next millisecond. A sidecar that goes idle between requests thousands
// of times a second kept it polling all the time, a wake-up (a context
// switch) every 20 µs. When the socket has no data or no room, the goroutine
// waits on Go's poller as net.Conn's Read and Write do, and the connection's
// deadlines apply.
//
// One goroutine may Read while another Writes; two concurrent Reads, or two
// concurrent Writes, are not allowed, as bufio readers and writers never do.
type rawIO struct {
	rc syscall.RawConn
}

// newRawIO returns a rawIO for nc, or nil when nc is not a socket with a
// file descriptor (a net.Pipe, a TLS connection).
func newRawIO(nc net.Conn) *rawIO {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return &rawIO{rc: rc}
}

// Read reads into p what the socket holds, waiting for data when it holds
// none. It returns io.EOF when the peer closed its side.
func (r *rawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		n, errno = rawRead(fd, p)
		return errno != syscall.EAGAIN
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, errno
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// rawRead is read(2) of a non-empty p, retried on EINTR.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

// Write writes all of p, waiting for room in the socket's buffer when it is
// full.
func (r *rawIO) Write(p []byte) (int, error) { return r.write(p, true) }

// TryWrite writes what of p the socket's buffer has room for now, without
// waiting: n < len(p) with a nil error when it is full.
func (r *rawIO) TryWrite(p []byte) (int, error) { return r.write(p, false) }

func (r *rawIO) write(p []byte, wait bool) (int, error) {
	var n int
	var errno syscall.Errno
	err := r.rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[n])), uintptr(len(p)-n))
			switch e {
			case 0:
				n += int(m)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return !wait // false: the poller waits for room
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = errno
	}
	return n, err
}

// rawConn is a net.Conn whose Read and Write are a rawIO's.
type rawConn struct {
	net.Conn
	io *rawIO
}

// Wrap returns nc reading and writing with raw system calls, or nc
// itself when it has no file descriptor.
func Wrap(nc net.Conn) net.Conn {
	if r := newRawIO(nc); r != nil {
		return &rawConn{Conn: nc, io: r}
	}
	return nc
}

func (c *rawConn) Read(p []byte) (int, error)  { return c.io.Read(p) }
func (c *rawConn) Write(p []byte) (int, error) { return c.io.Write(p) }

// TryWrite writes what of p fits in the socket's buffer now (rawIO.TryWrite).
func (c *rawConn) TryWrite(p []byte) (int, error) { return c.io.TryWrite(p) }

// Dialer dials Redis as rueidis does, with dial when not nil (a unix://
// URL sets one), and returns connections that read and write with raw
// system calls; TLS runs on top of them.
func Dialer(dial func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error)) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	return func(ctx context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		var nc net.Conn
		var err error
		if dial != nil {
			nc, err = dial(ctx, dst, d, cfg)
			if err != nil {
				return nil, err
			}
			return Wrap(nc), nil
		}
		nc, err = d.DialContext(ctx, "tcp", dst)
		if err != nil {
			return nil, err
		}
		nc = Wrap(nc)
		if cfg == nil {
			return nc, nil
		}
		// As tls.Dialer does: the server's name from the address unless the
		// config names one.
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			host, _, herr := net.SplitHostPort(dst)
			if herr != nil {
				host = dst
			}
			cfg.ServerName = host
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		return tc, nil
	}
}
