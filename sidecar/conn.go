package sidecar

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"quotad/protocol"
)

// readBufSize is the per-connection read buffer; longer lines are assembled
// in a scratch slice up to --max-line-bytes, so idle connections stay small.
const readBufSize = 4 << 10

// writeBufSize batches replies: the writer flushes when no finished reply is
// waiting, so pipelining clients get many replies per syscall.
const writeBufSize = 4 << 10

// slot is one request's place in a connection's reply order. out is written
// once, before done is set. Slots and their reply buffers are reused.
type slot struct {
	req   protocol.Request
	out   []byte
	done  atomic.Bool
	ready chan struct{} // a token when the group batcher answered (group.go)
}

var slots = sync.Pool{New: func() any { return new(slot) }}

func newSlot() *slot {
	sl := slots.Get().(*slot)
	sl.done.Store(false)
	return sl
}

// doneSlot is a slot whose reply is computed synchronously (errors, ping).
func doneSlot(out []byte) *slot {
	sl := newSlot()
	sl.out = out
	sl.done.Store(true)
	return sl
}

func freeSlot(sl *slot) {
	if cap(sl.out) > 4<<10 {
		sl.out = nil // keep no outsized buffer alive
	}
	slots.Put(sl)
}

// conn serves one client. One reader goroutine decodes lines and starts each
// request; one writer goroutine writes the replies in request order. The
// queue between them is bounded by --max-inflight-per-conn: when it is full
// the reader stops reading, so a client that never reads its replies holds
// at most that many requests in memory (backpressure, not buffering).
type conn struct {
	s     *Server
	nc    net.Conn
	queue chan *slot
	// wake gets a token whenever a request run on a worker is done; the
	// writer waits on it for the slot at the head of the queue.
	wake chan struct{}
	// running counts requests started on their own goroutine whose reply is
	// not computed yet. While a drain waits for them, the reader goes on
	// reading, so that lines the client sends meanwhile are answered
	// SHUTTING_DOWN instead of being cut off when the connection closes.
	running atomic.Int64
	// queued counts the slots sent to the queue whose reply the writer has
	// not yet handed to the socket (written and flushed). Only the reader
	// adds to it, so when it reads 0 the writer holds nothing and will get
	// nothing until the reader sends again.
	queued atomic.Int64
	// stopped tells the reader to read no more from the socket (see
	// pollSource): the connection is closed or draining.
	stopped atomic.Bool
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{s: s, nc: withRawIO(nc), queue: make(chan *slot, s.opts.MaxInflightPerConn), wake: make(chan struct{}, 1)}
}

func (c *conn) serve() {
	go c.writeLoop()
	c.readLoop()
}

// stopReading makes the blocked read return, so the reader answers the lines
// it already buffered and then closes the queue.
func (c *conn) stopReading() {
	c.stopped.Store(true)
	_ = c.nc.SetReadDeadline(time.Now())
}

// close ends the connection at once: the client sees it closed and the
// reader reads no more. The writer closes the socket itself once the reader
// is done (writeLoop): closing it while the reader is inside its RawRead
// (readLoop) would wait for the reader, which may be waiting for the writer.
func (c *conn) close() {
	raw, ok := c.nc.(*rawConn)
	if !ok {
		c.stopped.Store(true)
		c.nc.Close()
		return
	}
	_ = raw.io.rc.Control(func(fd uintptr) { _ = syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
	c.stopReading()
}

// drain is Shutdown's first step for one connection: an idle one stops
// reading at once; one with requests running stops when the last of them is
// answered (see start). shutting must already be set, so that either this
// call or the last request to finish sees the other's write.
func (c *conn) drain() {
	if c.running.Load() == 0 {
		c.stopReading()
	}
}

func (c *conn) readLoop() {
	defer close(c.queue)
	raw, ok := c.nc.(*rawConn)
	if !ok {
		c.readLines(protocol.NewLineReader(c.nc, readBufSize, c.s.opts.MaxLineBytes))
		return
	}
	// The reader stays inside one read of the socket: Go's poller calls f
	// when there may be data, f answers the lines it reads until the socket
	// is empty, and asks to wait again. A read that came back short emptied
	// the socket, so f waits rather than read once more only to get EAGAIN
	// (a system call per request for one-at-a-time clients): within one
	// RawRead, data that arrives after that read wakes the poller again.
	// (A new RawRead forgets what the poller saw before it; net.Conn's Read
	// must read first for that reason.)
	src := &pollSource{c: c}
	lr := protocol.NewLineReader(src, readBufSize, c.s.opts.MaxLineBytes)
	for {
		err := raw.io.rc.Read(func(fd uintptr) bool {
			src.fd, src.drained = fd, false
			if c.readLines(lr) {
				c.armIdle()
				return false
			}
			return true
		})
		if !c.idleExpired(err) {
			return
		}
	}
}

// armIdle is called by the reader each time it is about to wait for input,
// which is right after the last bytes it received: it sets the read
// deadline at which the connection counts as idle (--idle-timeout).
func (c *conn) armIdle() {
	d := c.s.opts.IdleTimeout
	if d <= 0 {
		return
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	if c.stopped.Load() {
		// stopReading ran meanwhile; its deadline, now, must win. It
		// stores stopped before setting its deadline, so either it set its
		// deadline after this one, or this sees stopped.
		_ = c.nc.SetReadDeadline(time.Now())
	}
}

// idleExpired is called with the error that ended the reader's wait. It
// reports whether the wait ended at armIdle's deadline while the connection
// was not idle after all: requests in flight (running, or replies not yet
// written), or bytes that arrived just now. Then the deadline moves on and
// the reader waits again. Otherwise the idle close is counted and the
// reader ends, which closes the connection; a reader stopped for another
// reason just ends.
func (c *conn) idleExpired(err error) (waitAgain bool) {
	d := c.s.opts.IdleTimeout
	if d <= 0 || !errors.Is(err, os.ErrDeadlineExceeded) || c.stopped.Load() {
		return false
	}
	if c.running.Load() > 0 || c.queued.Load() > 0 || c.hasInput() {
		// A past deadline would fail the next wait before it starts.
		c.armIdle()
		return true
	}
	c.s.connMetrics.idleClosed.Inc()
	return false
}

// hasInput reports whether the socket holds bytes not read yet.
func (c *conn) hasInput() bool {
	raw, ok := c.nc.(*rawConn)
	if !ok {
		return false
	}
	var n int
	_ = raw.io.rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}

// pollSource is the socket as readLoop's line reader reads it: raw reads
// of fd that say protocol.ErrWouldBlock when the socket is empty.
type pollSource struct {
	c       *conn
	fd      uintptr
	drained bool // the last read came back short
}

var errStopped = errors.New("the connection stopped reading")

func (s *pollSource) Read(p []byte) (int, error) {
	if s.c.stopped.Load() {
		return 0, errStopped
	}
	if s.drained || len(p) == 0 {
		return 0, protocol.ErrWouldBlock
	}
	n, errno := rawRead(s.fd, p)
	switch {
	case errno == syscall.EAGAIN:
		s.drained = true
		return 0, protocol.ErrWouldBlock
	case errno != 0:
		return 0, errno
	case n == 0:
		return 0, io.EOF
	}
	// A short read emptied the socket of data; but a peer's end of input
	// that came with the data shows only at the next read, and brings no
	// new wake-up. So the reader skips that read only when the data ends
	// lines that will be answered: a client reading a reply frees room in
	// the socket, and the poller's wake-up for that reports the end of
	// input too. A partial line or blank lines alone are read once more.
	s.drained = n < len(p) && p[n-1] == '\n' && hasRequest(p[:n])
	return n, nil
}

// hasRequest reports whether b holds a line that is not blank.
func hasRequest(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return true
		}
	}
	return false
}

// readLines answers the lines lr reads. It reports true when lr's source
// would block, so the reader should wait for more, and false when the input
// ended.
func (c *conn) readLines(lr *protocol.LineReader) (wait bool) {
	for {
		line, err := lr.ReadLine()
		if errors.Is(err, protocol.ErrTooLarge) {
			c.push(doneSlot(protocol.AppendErr(nil, nil, err)))
			continue
		}
		if errors.Is(err, protocol.ErrWouldBlock) {
			return true
		}
		if err != nil {
			// EOF, a closed connection or the shutdown read deadline: none
			// is worth a log line.
			return false
		}
		if isBlank(line) {
			continue
		}
		if lr.HasLine() {
			if !c.readBatch(lr, line) {
				return false
			}
			continue
		}
		// A client with nothing in flight that sent nothing more waits for
		// this reply before it sends again: run the request here rather
		// than hand it to a worker (one goroutine switch less per request
		// for one-at-a-time clients).
		inline := c.running.Load() == 0 && lr.Buffered() == 0
		sl := c.start(line, inline, nil)
		if inline && c.queued.Load() == 0 {
			// Every earlier reply is on the socket: write this one from here
			// too rather than wake the writer for it (another switch less).
			// An inline request's slot is done.
			_, err := c.nc.Write(sl.out)
			freeSlot(sl)
			if err != nil {
				c.close() // as the writer does: the client is gone
				return false
			}
			continue
		}
		c.push(sl)
	}
}

// push hands a slot to the writer.
func (c *conn) push(sl *slot) {
	c.queued.Add(1)
	c.queue <- sl
}

// readBatch starts line and the whole lines already buffered after it,
// and runs their fixed-window calls on one worker, which sends them to
// Redis together (batch.go). It reads no more lines than the queue has
// room for, so that queueing a staged request never blocks (the writer
// would wait for it at the head of the queue while the reader waits for the
// writer), and --max-inflight-per-conn still bounds the requests in memory.
// It reports false when the connection's input ended.
func (c *conn) readBatch(lr *protocol.LineReader, line []byte) bool {
	b := batches.Get().(*windowBatch)
	room := max(cap(c.queue)-len(c.queue), 1) // only the writer shrinks len
	ok, n := true, 0
	for {
		if !isBlank(line) {
			c.push(c.start(line, false, b))
			n++
		}
		if n >= room || n >= maxBatch || !lr.HasLine() {
			break
		}
		var err error
		line, err = lr.ReadLine()
		if errors.Is(err, protocol.ErrTooLarge) {
			c.push(doneSlot(protocol.AppendErr(nil, nil, err)))
			n++
			line = nil
			continue
		}
		if err != nil {
			ok = false
			break
		}
	}
	if len(b.items) == 0 {
		batches.Put(b)
	} else {
		c.s.workers.run(job{c: c, b: b})
	}
	return ok
}

// runBatch answers a batch's requests on a worker.
func (c *conn) runBatch(b *windowBatch) {
	c.s.runBatch(b)
	n := len(b.items)
	for i := range b.items {
		b.items[i].sl.done.Store(true) // the writer may reuse it from here on
	}
	b.reset()
	batches.Put(b)
	c.finished(int64(n))
}

// start decodes a line and, for requests that need Redis, runs them on a
// worker so one connection's requests execute concurrently, or on the
// reader itself when inline, or stages them in b, when not nil, for
// readBatch to run.
func (c *conn) start(line []byte, inline bool, b *windowBatch) *slot {
	sl := newSlot()
	if err := protocol.Decode(line, &sl.req); err != nil {
		sl.out = protocol.AppendErr(sl.out[:0], sl.req.ID, err)
		sl.done.Store(true)
		return sl
	}
	if c.s.shutting.Load() {
		sl.out = protocol.AppendError(sl.out[:0], sl.req.ID, protocol.CodeShuttingDown, "the sidecar is shutting down: the request was not run")
		sl.done.Store(true)
		return sl
	}
	if sl.req.Op == protocol.OpPing {
		sl.out = c.s.handle(c.s.reqCtx, &sl.req, sl.out[:0])
		sl.done.Store(true)
		return sl
	}
	if b != nil {
		if l, ok := c.s.batchable(&sl.req); ok {
			c.running.Add(1)
			if !c.s.stage(b, sl, l) { // answered without Redis
				sl.done.Store(true)
				c.finished(1)
			}
			return sl
		}
	}
	c.running.Add(1)
	if !inline {
		c.s.workers.run(job{c: c, sl: sl})
		return sl
	}
	if l, ok := c.s.batchable(&sl.req); ok {
		// It shares its Redis call with other connections' (group.go).
		c.s.group.run(sl, l)
		sl.done.Store(true)
		c.finished(1)
		return sl
	}
	c.run(sl)
	return sl
}

// run computes a slot's reply on a worker. Once done is set the writer may
// reuse the slot, so sl is not touched after.
func (c *conn) run(sl *slot) {
	sl.out = c.s.handle(c.s.reqCtx, &sl.req, sl.out[:0])
	sl.done.Store(true)
	c.finished(1)
}

// finished wakes the writer for n requests whose slots are done, and ends
// a drain when they were the last running.
func (c *conn) finished(n int64) {
	select {
	case c.wake <- struct{}{}:
	default: // a token is already waiting; the writer checks done again
	}
	if c.running.Add(-n) == 0 && c.s.shutting.Load() {
		c.stopReading()
	}
}

func (c *conn) writeLoop() {
	defer c.s.untrack(c)
	defer c.nc.Close() // the reader closed the queue: it is done
	bw := bufio.NewWriterSize(c.nc, writeBufSize)
	broken := false
	for sl := range c.queue {
		if !sl.done.Load() {
			// Send the replies already written before waiting on one that is
			// not: they must not wait for a later request's Redis call.
			if !broken && bw.Buffered() > 0 && bw.Flush() != nil {
				broken = true
				c.close()
			}
			for !sl.done.Load() {
				<-c.wake
			}
		}
		if broken {
			freeSlot(sl)
			c.queued.Add(-1)
			continue // keep draining so the reader is never blocked on the queue
		}
		_, err := bw.Write(sl.out)
		freeSlot(sl)
		if err == nil && len(c.queue) == 0 {
			err = bw.Flush()
		}
		if err != nil {
			// The client is gone or stopped reading past a deadline: close so
			// the reader stops too.
			broken = true
			c.close()
		}
		c.queued.Add(-1) // after the flush: see queued
	}
	if !broken {
		_ = bw.Flush()
	}
}

func isBlank(line []byte) bool {
	for _, b := range line {
		if b != ' ' && b != '\t' && b != '\r' {
			return false
		}
	}
	return true
}
