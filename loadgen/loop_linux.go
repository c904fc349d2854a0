package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

// On Linux one goroutine drives every connection from an epoll set: it
// reads the replies of all the connections that have some, and writes each
// the requests that refill its in-flight window, in one system call per
// connection each way. A reader and a writer goroutine per connection
// (loadgen.go, elsewhere) cost the generator more CPU per decision than the
// sidecar spends on it when clients send one request at a time, and on a
// machine with few cores that CPU is taken from the sidecar and Redis.

// loopConn is one connection of the loop.
type loopConn struct {
	*client
	fd          int
	rbuf        []byte // read buffer; rbuf[:rlen] holds a partial reply
	rlen        int
	sent        []time.Time // send times of the outstanding requests, a ring
	head, out   int         // the oldest outstanding request's place, and how many
	wbuf        []byte      // requests not yet written (the socket was full)
	seq         uint64
	closedWrite bool // the run ended: shut the write side once wbuf is out
	shut        bool
	// watchingRoom: the set reports room to write (wbuf waits for it).
	watchingRoom bool
	done         bool
}

// useLoop is a variable for the tests, which run both ways.
var useLoop = true

const loopReadBuf = 64 << 10

func dialLoop(cfg *Config, id int) (*loopConn, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: cfg.Socket}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return &loopConn{
		client: newClient(cfg, id),
		fd:     fd,
		rbuf:   make([]byte, loopReadBuf),
		sent:   make([]time.Time, cfg.InFlight),
	}, nil
}

func runLoop(ctx context.Context, cfg *Config) (Result, error) {
	conns := make([]*loopConn, 0, cfg.Conns)
	defer func() {
		for _, c := range conns {
			syscall.Close(c.fd)
		}
	}()
	for i := range cfg.Conns {
		c, err := dialLoop(cfg, i)
		if err != nil {
			return Result{}, fmt.Errorf("loadgen: connect to %s: %w", cfg.Socket, err)
		}
		conns = append(conns, c)
	}
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return Result{}, fmt.Errorf("loadgen: epoll: %w", err)
	}
	defer syscall.Close(ep)
	for i, c := range conns {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(i)}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
			return Result{}, fmt.Errorf("loadgen: epoll: %w", err)
		}
	}

	clients := make([]*client, len(conns))
	for i, c := range conns {
		clients[i] = c.client
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(progressDone)
		progress(cfg, clients, start, stopProgress)
	}()
	deadline := start.Add(cfg.Duration)

	sending := true
	for _, c := range conns {
		c.send(cfg.InFlight, ep)
	}
	events := make([]syscall.EpollEvent, len(conns))
	// A raw epoll_wait keeps its processor while it waits; with one, the
	// rest of the process would run only when the runtime preempts it.
	wait := epollWait
	if runtime.GOMAXPROCS(0) == 1 {
		wait = syscall.EpollWait
	}
	open := len(conns)
	for open > 0 {
		if sending && (ctx.Err() != nil || !time.Now().Before(deadline)) {
			sending = false
			for _, c := range conns {
				c.closeWrite()
			}
		}
		if !sending && ctx.Err() != nil {
			break // cancelled: do not wait for the last replies
		}
		// Wake at least every 10 ms to notice the end of the run.
		n, err := wait(ep, events, 10)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			close(stopProgress)
			<-progressDone
			return Result{}, fmt.Errorf("loadgen: epoll: %w", err)
		}
		for _, ev := range events[:n] {
			c := conns[ev.Fd]
			if c.done {
				continue
			}
			if ev.Events&syscall.EPOLLOUT != 0 {
				c.flush(ep)
			}
			if ev.Events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
				replies := c.read()
				if c.done {
					open--
					_ = syscall.EpollCtl(ep, syscall.EPOLL_CTL_DEL, c.fd, nil)
					continue
				}
				if sending && replies > 0 {
					c.send(replies, ep)
				}
			}
		}
	}
	elapsed := time.Since(start)
	close(stopProgress)
	<-progressDone
	return collect(clients, elapsed)
}

// send appends n requests to what is waiting to be written and writes.
func (c *loopConn) send(n int, ep int) {
	now := time.Now()
	for range n {
		c.seq++
		c.wbuf = c.appendRequest(c.wbuf, c.seq)
		c.sent[(c.head+c.out)%len(c.sent)] = now
		c.out++
	}
	c.flush(ep)
}

// flush writes what it can of wbuf, and asks epoll for room when the
// socket is full.
func (c *loopConn) flush(ep int) {
	for len(c.wbuf) > 0 {
		n, err := rawWrite(c.fd, c.wbuf)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if errors.Is(err, syscall.EAGAIN) {
			c.watchRoom(ep, true)
			return
		}
		if err != nil {
			c.wbuf = c.wbuf[:0] // the read side reports the broken connection
			return
		}
		c.wbuf = c.wbuf[:copy(c.wbuf, c.wbuf[n:])]
	}
	c.watchRoom(ep, false)
	if c.closedWrite {
		c.shutdown()
	}
}

// watchRoom asks epoll to report room in the socket, or stops asking; it
// changes the set only when that changes.
func (c *loopConn) watchRoom(ep int, on bool) {
	if c.watchingRoom == on {
		return
	}
	c.watchingRoom = on
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.id)}
	if on {
		ev.Events |= syscall.EPOLLOUT
	}
	_ = syscall.EpollCtl(ep, syscall.EPOLL_CTL_MOD, c.fd, &ev)
}

// closeWrite ends the connection's requests: once what waits to be
// written is out, the sidecar sees end of input, answers what it read and
// closes, which ends the reads after the last reply.
func (c *loopConn) closeWrite() {
	c.closedWrite = true
	if len(c.wbuf) == 0 {
		c.shutdown()
	}
}

func (c *loopConn) shutdown() {
	if !c.shut {
		c.shut = true
		_ = syscall.Shutdown(c.fd, syscall.SHUT_WR)
	}
}

// read reads what the socket holds and counts the whole replies in it.
func (c *loopConn) read() (replies int) {
	for {
		if c.rlen == len(c.rbuf) {
			c.fail(fmt.Errorf("a reply longer than %d bytes", len(c.rbuf)))
			return replies
		}
		space := len(c.rbuf) - c.rlen
		n, err := rawRead(c.fd, c.rbuf[c.rlen:])
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if errors.Is(err, syscall.EAGAIN) {
			return replies
		}
		if err != nil {
			c.fail(err)
			return replies
		}
		if n == 0 {
			if c.out > 0 || c.rlen > 0 {
				c.fail(io.EOF)
			}
			c.done = true
			return replies
		}
		c.rlen += n
		buf := c.rbuf[:c.rlen]
		for {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				break
			}
			if !c.reply(buf[:i]) {
				return replies
			}
			replies++
			buf = buf[i+1:]
		}
		c.rlen = copy(c.rbuf, buf)
		if n < space {
			return replies // a short read emptied the socket
		}
	}
}

// reply counts one reply line against the oldest outstanding request.
func (c *loopConn) reply(line []byte) bool {
	if c.out == 0 {
		c.fail(fmt.Errorf("a reply to no request: %q", line))
		return false
	}
	at := c.sent[c.head]
	c.head = (c.head + 1) % len(c.sent)
	c.out--
	c.lat.record(time.Since(at))
	c.answered(line)
	c.replies.Add(1)
	return true
}

func (c *loopConn) fail(err error) {
	c.err = fmt.Errorf("loadgen: connection %d: read with %d replies outstanding: %w", c.id, c.out, err)
	c.done = true
}

// The loop's system calls are raw: they skip the runtime's entersyscall
// and exitsyscall, whose bookkeeping woke the runtime's monitor thread
// every 20 µs and handed the loop's processor over at every epoll_wait. The
// socket calls never block, and epoll_wait blocks at most 10 ms, which
// bounds how long a garbage collection waits to stop this goroutine.

func epollWait(ep int, events []syscall.EpollEvent, msec int) (int, error) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_WAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawRead(fd int, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

func rawWrite(fd int, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}
