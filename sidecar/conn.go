package sidecar

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"quotad/dispatch"
	"quotad/protocol"
	"quotad/rawio"
)

// readBufSize is the per-connection read buffer; longer lines are assembled
// in a scratch slice up to --max-line-bytes, so idle connections stay small.
const readBufSize = 4 << 10

// writeBufSize batches replies: the writer flushes when no finished reply is
// waiting, so pipelining clients get many replies per syscall.
const writeBufSize = 4 << 10

// writeBufs holds the reply buffers of connections that have nothing to
// write. A writer takes one for the replies it writes and gives it back
// when it has flushed them, so an idle connection holds none: 2,000 idle
// clients hold about 8 MB less.
var writeBufs = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufSize) }}

// pending is a request waiting for its reply, in its connection's reply
// order. The reader fills req and queues it; out is written once, before
// done is set; after done the writer owns it and frees it. They are reused.
type pending struct {
	c    *conn
	req  protocol.Request
	dec  dispatch.Decision
	out  []byte
	done atomic.Bool
	// links are the Redis keys the request decides on (several for a take
	// of several limits), each with the request of the same connection on
	// that key that waits for this one to be decided (same-key order);
	// waits counts the earlier requests this one waits for. All are
	// guarded by c.mu.
	links []keyLink
	waits int
}

// keyLink is one key of a request and the next request on it.
type keyLink struct {
	key  string
	next *pending
}

var pendings sync.Pool

func init() {
	// Set here, not in pendings' declaration: decided frees pendings itself.
	pendings.New = func() any {
		pr := new(pending)
		pr.dec.Done = pr.decided
		return pr
	}
}

func newPending(c *conn) *pending {
	pr := pendings.Get().(*pending)
	pr.c = c
	pr.done.Store(false)
	return pr
}

func freePending(pr *pending) {
	if cap(pr.out) > 4<<10 {
		pr.out = nil // keep no outsized buffer alive
	}
	clear(pr.links)
	pr.c, pr.links, pr.waits = nil, pr.links[:0], 0
	pendings.Put(pr)
}

// conn serves one client. One reader goroutine decodes lines and hands each
// request to the dispatcher; one writer goroutine writes the replies in
// request order, except that a reply with nothing before it to wait for is
// written at once by the goroutine that decided it (place). The queue between them is bounded by
// --max-inflight-per-conn: when it is full the reader stops reading, so a
// client that never reads its replies holds at most that many requests in
// memory (backpressure, not buffering).
//
// Requests on different keys run concurrently; requests on the same key
// run in the order they were written: a request whose key has an earlier
// request of this connection in flight waits for it (keys).
type conn struct {
	s     *Server
	nc    net.Conn
	queue chan *pending
	// wake gets a token whenever a request is decided; the writer waits on
	// it for the request at the head of the queue.
	wake chan struct{}
	// running counts requests pushed and not yet decided. While a drain
	// waits for them, the reader goes on reading, so that lines the client
	// sends meanwhile are answered SHUTTING_DOWN instead of being cut off.
	running atomic.Int64
	// unwritten counts the replies queued that the writer has not yet put
	// on the socket (written and flushed): with running, what keeps a
	// connection from being idle.
	unwritten atomic.Int64
	// stopped tells the reader to read no more: the connection is closed
	// or draining.
	stopped atomic.Bool

	mu sync.Mutex
	// keys maps a key with a request in flight to the last request queued
	// on it, whose next the following request on that key joins.
	keys map[string]*pending

	// A request that comes when no reply is unwritten goes to head instead
	// of the queue, and the goroutine that decides it writes its reply at
	// once (writeHere), without a hand-off to the writer: for a client that
	// sends one request at a time, that is one goroutine wake-up less per
	// request. tryWrite is the socket's write that never waits (rawio); nil
	// turns this off. wmu guards head, busy (a decider is writing head)
	// and waiting (the writer waits for that write, on kick).
	tryWrite func([]byte) (int, error)
	wmu      sync.Mutex
	head     *pending
	busy     bool
	waiting  bool
	kick     chan struct{}
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: rawio.Wrap(nc), queue: make(chan *pending, s.opts.MaxInflightPerConn),
		wake: make(chan struct{}, 1), keys: make(map[string]*pending), kick: make(chan struct{}, 1)}
	if tw, ok := c.nc.(interface{ TryWrite([]byte) (int, error) }); ok {
		c.tryWrite = tw.TryWrite
	}
	return c
}

func (c *conn) serve() {
	go c.writeLoop()
	c.readLoop()
}

// stopReading makes the blocked read return, so the reader answers the lines
// it already read and then closes the queue.
func (c *conn) stopReading() {
	c.stopped.Store(true)
	_ = c.nc.SetReadDeadline(time.Now())
}

// close ends the connection at once: the client sees it closed, the read
// in progress returns, and the writer stops writing.
func (c *conn) close() {
	c.stopped.Store(true)
	c.nc.Close()
}

// drain is Shutdown's first step for one connection: an idle one stops
// reading at once; one with requests running stops when the last of them is
// answered (see finished). shutting must already be set, so that either
// this call or the last request to finish sees the other's write.
func (c *conn) drain() {
	if c.running.Load() == 0 {
		c.stopReading()
	}
}

func (c *conn) readLoop() {
	defer close(c.queue)
	var src io.Reader = c.nc
	idle := c.s.opts.IdleTimeout
	if idle > 0 {
		src = idleReader{c}
	}
	lr := protocol.NewLineReader(src, readBufSize, c.s.opts.MaxLineBytes)
	for !c.stopped.Load() {
		if idle > 0 && !lr.HasLine() {
			c.armIdle(idle)
		}
		line, err := lr.ReadLine()
		if errors.Is(err, protocol.ErrTooLarge) {
			c.refuse(newPending(c), protocol.CodeTooLarge, protocol.AppendErr(nil, nil, err))
			continue
		}
		if errors.Is(err, protocol.ErrWouldBlock) {
			// The idle deadline passed. A connection with requests in
			// flight, replies not yet written or a partial line is not
			// idle: it waits again.
			if c.running.Load() > 0 || c.unwritten.Load() > 0 || lr.Buffered() > 0 {
				continue
			}
			c.s.connMetrics.idleClosed.Inc()
			c.close()
			return
		}
		if err != nil {
			// EOF, a closed connection or the shutdown read deadline: none
			// is worth a log line.
			return
		}
		if !isBlank(line) {
			c.start(line)
		}
	}
}

// armIdle sets the read deadline at which the connection counts as idle
// (--idle-timeout): the reader calls it each time it is about to wait for
// a new line.
func (c *conn) armIdle(d time.Duration) {
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	if c.stopped.Load() {
		// stopReading ran meanwhile; its deadline, now, must win. It
		// stores stopped before setting its deadline, so either it set its
		// deadline after this one, or this sees stopped.
		_ = c.nc.SetReadDeadline(time.Now())
	}
}

// idleReader is the socket as the reader reads it under --idle-timeout:
// the idle deadline reads as protocol.ErrWouldBlock, so the line reader
// keeps a partial line across it and the reader decides whether the
// connection is idle. A deadline that stopReading set still ends the read.
type idleReader struct{ c *conn }

func (r idleReader) Read(p []byte) (int, error) {
	n, err := r.c.nc.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && !r.c.stopped.Load() {
		return n, protocol.ErrWouldBlock
	}
	return n, err
}

// answer queues a reply computed by the reader itself.
func (c *conn) answer(pr *pending, out []byte) {
	pr.out = out
	pr.done.Store(true)
	c.unwritten.Add(1)
	c.queue <- pr
}

// refuse answers a request the reader refuses itself with an error reply
// of code, and counts it.
func (c *conn) refuse(pr *pending, code protocol.Code, out []byte) {
	c.s.dispatch.ObserveRefused(pr.req.Op, code)
	c.answer(pr, out)
}

// start decodes a line and queues its request: answered at once when it
// needs no Redis (a bad line, a ping, a draining sidecar, a request the
// dispatcher refuses), else handed to the dispatcher, or queued behind the
// request of this connection that is in flight on the same key.
func (c *conn) start(line []byte) {
	pr := newPending(c)
	req := &pr.req
	err := protocol.Decode(line, req)
	if req.TraceInvalid {
		c.s.metrics.traceInvalid.Inc()
	}
	if err != nil {
		code := protocol.CodeInvalid
		if pe, ok := errors.AsType[*protocol.Error](err); ok {
			code = pe.Code
		}
		c.refuse(pr, code, protocol.AppendErr(pr.out[:0], req.ID, err))
		return
	}
	if c.s.shutting.Load() {
		c.refuse(pr, protocol.CodeShuttingDown, protocol.AppendError(pr.out[:0], req.ID, protocol.CodeShuttingDown, "the sidecar is shutting down: the request was not run"))
		return
	}
	if req.Op == protocol.OpPing {
		c.answer(pr, c.s.ping(req, pr.out[:0]))
		return
	}
	c.running.Add(1)
	c.place(pr) // the reply's place comes before the request runs
	if _, decided := c.s.dispatch.Prepare(req, &pr.dec); decided {
		return // refused: Done was called, and pr may be gone
	}
	var one [1]string // a take of one limit's key, without an allocation
	keys := pr.dec.AppendKeys(one[:0])
	c.mu.Lock()
	for _, k := range keys {
		pr.links = append(pr.links, keyLink{key: k})
		if last, ok := c.keys[k]; ok {
			last.link(k).next = pr
			pr.waits++
		}
		c.keys[k] = pr
	}
	waits := pr.waits
	c.mu.Unlock()
	if waits > 0 {
		return // the decisions it waits for run this one
	}
	c.s.dispatch.Run(&pr.dec)
}

// place gives a request's reply its place in the reply order: head when
// no reply is unwritten (every earlier one is on the socket, so nothing
// can come before it), else the queue.
func (c *conn) place(pr *pending) {
	if c.tryWrite != nil {
		c.wmu.Lock()
		if c.head == nil && c.unwritten.Load() == 0 {
			c.head = pr
			c.unwritten.Add(1)
			c.wmu.Unlock()
			return
		}
		c.wmu.Unlock()
	}
	c.unwritten.Add(1)
	c.queue <- pr
}

// writeHere writes pr's reply in the calling goroutine when pr is the
// head, without waiting for room in the socket. It reports whether all of
// it went; then pr is done with. What did not fit stays in head for the
// writer.
func (c *conn) writeHere(pr *pending) bool {
	c.wmu.Lock()
	if c.head != pr {
		c.wmu.Unlock()
		return false
	}
	c.busy = true
	c.wmu.Unlock()
	n, err := c.tryWrite(pr.out)
	all := err == nil && n == len(pr.out)
	c.wmu.Lock()
	c.busy = false
	kick := c.waiting || !all
	if all {
		c.head = nil
	} else {
		pr.out = pr.out[n:] // the writer writes the rest, or meets the error
	}
	c.wmu.Unlock()
	if all {
		c.unwritten.Add(-1)
	}
	if kick {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	return all
}

// takeHead hands the head to the writer, once a decider writing it is
// done.
func (c *conn) takeHead() *pending {
	c.wmu.Lock()
	for c.busy {
		c.waiting = true
		c.wmu.Unlock()
		<-c.kick
		c.wmu.Lock()
	}
	c.waiting = false
	h := c.head
	c.head = nil
	c.wmu.Unlock()
	return h
}

// link is pr's link of key; c.mu is held.
func (pr *pending) link(key string) *keyLink {
	for i := range pr.links {
		if pr.links[i].key == key {
			return &pr.links[i]
		}
	}
	panic("sidecar: no link of key " + key)
}

// decided is a request's Decision.Done: it renders the reply, runs the
// next request on the same key, and writes the reply or hands the request to
// the writer.
func (pr *pending) decided() {
	c := pr.c
	pr.out = pr.dec.Out.AppendReply(pr.out[:0], pr.req.ID)
	var ready [1]*pending
	next := ready[:0]
	if len(pr.links) > 0 {
		c.mu.Lock()
		for _, l := range pr.links {
			if l.next == nil {
				delete(c.keys, l.key)
				continue
			}
			if l.next.waits--; l.next.waits == 0 {
				next = append(next, l.next)
			}
		}
		c.mu.Unlock()
	}
	if c.tryWrite != nil && c.writeHere(pr) {
		freePending(pr)
		c.ended()
	} else {
		pr.done.Store(true) // the writer may free pr from here on
		c.finished()
	}
	for _, n := range next {
		c.s.dispatch.Run(&n.dec)
	}
}

// finished wakes the writer for a decided request, and ends a drain when it
// was the last running.
func (c *conn) finished() {
	select {
	case c.wake <- struct{}{}:
	default: // a token is already waiting; the writer checks done again
	}
	c.ended()
}

// ended counts a request decided, and ends a drain when it was the last
// running.
func (c *conn) ended() {
	if c.running.Add(-1) == 0 && c.s.shutting.Load() {
		c.stopReading()
	}
}

func (c *conn) writeLoop() {
	defer c.s.untrack(c)
	defer c.nc.Close()   // the reader closed the queue: it is done
	var bw *bufio.Writer // from writeBufs while it holds replies
	broken := false
	held := int64(0) // replies in bw, not flushed yet
	flush := func() error {
		if bw == nil {
			return nil
		}
		err := bw.Flush()
		c.unwritten.Add(-held)
		held = 0
		bw.Reset(nil)
		writeBufs.Put(bw)
		bw = nil
		return err
	}
	write := func(pr *pending) {
		if !pr.done.Load() {
			// Send the replies already written before waiting on one that is
			// not: they must not wait for a later request's Redis call.
			if !broken && bw != nil && flush() != nil {
				broken = true
				c.close()
			}
			for !pr.done.Load() {
				<-c.wake
			}
		}
		if broken {
			freePending(pr)
			c.unwritten.Add(-1)
			return // keep draining so the reader is never blocked on the queue
		}
		if bw == nil {
			bw = writeBufs.Get().(*bufio.Writer)
			bw.Reset(c.nc)
		}
		_, err := bw.Write(pr.out)
		freePending(pr)
		held++
		if err == nil && len(c.queue) == 0 {
			err = flush()
		}
		if err != nil {
			// The client is gone or stopped reading past a deadline: close so
			// the reader stops too.
			broken = true
			c.close()
		}
	}
	for {
		var pr *pending
		open := true
		select {
		case pr, open = <-c.queue:
		default:
			if !broken && bw != nil && flush() != nil {
				broken = true
				c.close()
			}
			select {
			case pr, open = <-c.queue:
			case <-c.kick: // a head's reply that did not fit on the socket
			}
		}
		// The head comes before every queued reply (place).
		if c.tryWrite != nil {
			if h := c.takeHead(); h != nil {
				write(h)
			}
		}
		if pr != nil {
			write(pr)
		}
		if !open {
			break // the reader closed the queue: it is done
		}
	}
	if !broken {
		_ = flush()
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
