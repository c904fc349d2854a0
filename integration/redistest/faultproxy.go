package redistest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// Direction names one way through a FaultProxy; faults that differ by way
// take a Direction, and Both sets the two alike.
type Direction int

const (
	// ToServer carries the client's bytes (commands) to the target.
	ToServer Direction = 1 << iota
	// ToClient carries the target's bytes (replies) back to the client.
	ToClient
	// Both is ToServer and ToClient.
	Both = ToServer | ToClient
)

// chunkQueue is how many chunks one way of a connection holds between its
// reader and its writer: the bytes in flight on a slow or delayed link. A
// full queue stops the reader, as a full TCP window stops a sender.
const chunkQueue = 1024

// chunkBytes is the most one read takes from a connection.
const chunkBytes = 32 << 10

// shapeSlice is the longest stretch of a capped link's time that one write
// reserves, so that connections sharing the link interleave finely.
const shapeSlice = 20 * time.Millisecond

// FaultProxy is a TCP proxy between a client and a target address that
// injects network faults at run time: latency, a blackhole, resets,
// refused connections and a bandwidth cap. Each way of each connection is a
// delay line: a chunk read at t leaves at t plus the latency in force when
// it was read, in order, while later chunks keep being read, so latency
// delays bytes without throttling them. Faults apply to connections already
// open as well as to new ones.
type FaultProxy struct {
	target string
	addr   string

	mu       sync.Mutex
	ln       net.Listener // nil while refusing
	conns    map[*proxyConn]struct{}
	latency  [2]time.Duration // by way index
	blocked  bool
	changed  chan struct{} // closed and replaced when a fault changes
	closed   bool
	links    [2]link // the bandwidth cap of each way, shared by every connection
	accepted int64
	wg       sync.WaitGroup
	bytes    [2]atomic.Int64 // bytes passed on, by way index
}

// StartFaultProxy listens on a free port of 127.0.0.1 and forwards every
// connection to target; it is closed when the test ends.
func StartFaultProxy(t testing.TB, target string) *FaultProxy {
	t.Helper()
	p, err := NewFaultProxy(target)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// NewFaultProxy is StartFaultProxy for programs that are not tests; the
// proxy runs until Close.
func NewFaultProxy(target string) (*FaultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fault proxy: listen: %w", err)
	}
	p := &FaultProxy{
		target:  target,
		addr:    ln.Addr().String(),
		conns:   make(map[*proxyConn]struct{}),
		changed: make(chan struct{}),
	}
	p.serve(ln)
	return p, nil
}

// Addr is the proxy's "127.0.0.1:port", the same across Refuse.
func (p *FaultProxy) Addr() string { return p.addr }

// URL is "redis://" and Addr.
func (p *FaultProxy) URL() string { return "redis://" + p.addr }

// Client returns a new rueidis client connected to the target through the
// proxy, closed when the test ends.
func (p *FaultProxy) Client(t testing.TB) rueidis.Client {
	t.Helper()
	c, err := newClient(p.addr)
	if err != nil {
		t.Fatalf("connect through the fault proxy at %s: %v", p.addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// SetLatency delays every chunk of bytes that the ways in dir read from now
// on by d (0: none); chunks already read keep the delay they were given.
func (p *FaultProxy) SetLatency(dir Direction, d time.Duration) {
	p.mu.Lock()
	for i := range p.latency {
		if dir&(1<<i) != 0 {
			p.latency[i] = d
		}
	}
	p.notifyLocked()
	p.mu.Unlock()
}

// SetBandwidth caps the ways in dir to bytesPerSec each (0: no cap), shared
// by every connection through the proxy as one link would be.
func (p *FaultProxy) SetBandwidth(dir Direction, bytesPerSec int64) {
	p.mu.Lock()
	for i := range p.links {
		if dir&(1<<i) != 0 {
			p.links[i].setRate(bytesPerSec)
		}
	}
	p.notifyLocked()
	p.mu.Unlock()
}

// Blackhole stops (on) or resumes passing bytes both ways. Connections stay
// open and the proxy keeps reading what each side sends, up to chunkQueue
// chunks a way, but delivers nothing: as a partition does to TCP, bytes are
// held, not lost, and arrive once it heals, unless a side gave up and
// closed its connection first. New connections are accepted and held alike.
func (p *FaultProxy) Blackhole(on bool) {
	p.mu.Lock()
	p.blocked = on
	p.notifyLocked()
	p.mu.Unlock()
}

// Refuse makes new connections fail (on) with "connection refused" by
// closing the listener, or accepts them again on the same address (off).
// Open connections are not touched.
func (p *FaultProxy) Refuse(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("fault proxy: closed")
	}
	if on {
		if p.ln != nil {
			p.ln.Close() // the accept loop sees it and ends
			p.ln = nil
		}
		return nil
	}
	if p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("fault proxy: listen again on %s: %w", p.addr, err)
	}
	p.serveLocked(ln)
	return nil
}

// Reset ends every open connection with a TCP reset to both its client and
// its target. New connections are accepted as before.
func (p *FaultProxy) Reset() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.abort()
	}
}

// Conns is how many connections are open through the proxy.
func (p *FaultProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted is how many connections the proxy has accepted since it started.
func (p *FaultProxy) Accepted() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Bytes is how many bytes the proxy has passed on the way dir since it
// started (a write that fails, ending its connection, counts too).
func (p *FaultProxy) Bytes(dir Direction) int64 {
	var n int64
	for i := range p.bytes {
		if dir&(1<<i) != 0 {
			n += p.bytes[i].Load()
		}
	}
	return n
}

// Buffered is how many bytes the open connections hold the way dir: read
// from one side and not yet delivered to the other (delayed, shaped or
// held by a blackhole).
func (p *FaultProxy) Buffered(dir Direction) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for c := range p.conns {
		for i := range c.held {
			if dir&(1<<i) != 0 {
				n += c.held[i].Load()
			}
		}
	}
	return n
}

// Close stops accepting, resets every open connection and returns once
// every goroutine of the proxy has ended.
func (p *FaultProxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.notifyLocked()
	p.mu.Unlock()
	p.Reset()
	p.wg.Wait()
	return nil
}

// notifyLocked wakes every writer waiting on the faults in force.
func (p *FaultProxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// faults says whether the proxy is a blackhole now, and the channel closed
// when that or another fault changes.
func (p *FaultProxy) faults() (blocked bool, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocked && !p.closed, p.changed
}

func (p *FaultProxy) latencyOf(w int) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency[w]
}

func (p *FaultProxy) serve(ln net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.serveLocked(ln)
}

func (p *FaultProxy) serveLocked(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed by Refuse or Close
			}
			p.accept(c.(*net.TCPConn))
		}
	}()
}

func (p *FaultProxy) accept(client *net.TCPConn) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		reset(client)
		return
	}
	p.accepted++
	pc := &proxyConn{p: p, client: client, done: make(chan struct{})}
	p.conns[pc] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	go pc.run()
}

// proxyConn is one client connection and its connection to the target.
type proxyConn struct {
	p      *FaultProxy
	client *net.TCPConn
	once   sync.Once
	done   chan struct{} // closed by abort

	mu     sync.Mutex
	target *net.TCPConn // nil until dialled

	held [2]atomic.Int64 // bytes read and not yet delivered, by way index
}

// chunk is bytes read at one moment; nil data is the end of the way's
// stream (the reader saw EOF).
type chunk struct {
	data []byte
	due  time.Time // when it may leave: read time plus latency
}

func (c *proxyConn) run() {
	defer c.p.wg.Done()
	defer c.forget()
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", c.p.target)
	if err != nil {
		c.abort()
		return
	}
	target := conn.(*net.TCPConn)
	c.mu.Lock()
	c.target = target
	c.mu.Unlock()
	select {
	case <-c.done: // reset while dialling
		reset(target)
		return
	default:
	}
	var ways sync.WaitGroup
	for w, pair := range [2][2]*net.TCPConn{{c.client, target}, {target, c.client}} {
		q := make(chan chunk, chunkQueue)
		ways.Go(func() { c.read(w, pair[0], q) })
		ways.Go(func() { c.write(w, pair[1], q) })
	}
	ways.Wait()
	c.finish()
}

// read moves src's bytes onto q, each chunk stamped with when it may
// leave, until src ends or the connection is aborted.
func (c *proxyConn) read(w int, src *net.TCPConn, q chan<- chunk) {
	buf := make([]byte, chunkBytes)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch := chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(c.p.latencyOf(w))}
			c.held[w].Add(int64(n))
			select {
			case q <- ch:
			case <-c.done:
				return
			}
		}
		if err != nil {
			if !isEOF(err) {
				c.abort() // a reset or a closed connection ends both ways
				return
			}
			select {
			case q <- chunk{due: time.Now().Add(c.p.latencyOf(w))}:
			case <-c.done:
			}
			return
		}
	}
}

// write delivers q's chunks to dst in order, each no earlier than its due
// time, none while the proxy is a blackhole, within the way's bandwidth.
// At the end of the stream it half-closes dst, so an orderly close
// travels as the bytes did.
func (c *proxyConn) write(w int, dst *net.TCPConn, q <-chan chunk) {
	for {
		var ch chunk
		select {
		case ch = <-q:
		case <-c.done:
			return
		}
		if !c.wait(ch.due) {
			return
		}
		if ch.data == nil {
			_ = dst.CloseWrite()
			return
		}
		for data := ch.data; len(data) > 0; {
			n := len(data)
			if at, size := c.p.links[w].reserve(n); !at.IsZero() {
				n = size
				if !c.sleep(at) {
					return
				}
				// The link may have become a blackhole meanwhile.
				if !c.wait(time.Time{}) {
					return
				}
			}
			// Counted before the write, so that a peer that has read the
			// bytes never finds them still held or not yet passed on.
			c.held[w].Add(-int64(n))
			c.p.bytes[w].Add(int64(n))
			if _, err := dst.Write(data[:n]); err != nil {
				c.abort()
				return
			}
			data = data[n:]
		}
	}
}

// wait returns once due has passed and the proxy is not a blackhole, or
// false when the connection is aborted first.
func (c *proxyConn) wait(due time.Time) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		blocked, changed := c.p.faults()
		var fire <-chan time.Time
		if d := time.Until(due); d > 0 {
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			fire = timer.C
		} else if !blocked {
			return true
		}
		select {
		case <-c.done:
			return false
		case <-changed:
		case <-fire:
		}
	}
}

// sleep waits until at, or returns false when the connection is aborted
// first.
func (c *proxyConn) sleep(at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.done:
		return false
	}
}

// abort ends the connection both ways with a reset, once.
func (c *proxyConn) abort() {
	c.once.Do(func() {
		close(c.done)
		reset(c.client)
		c.mu.Lock()
		if c.target != nil {
			reset(c.target)
		}
		c.mu.Unlock()
	})
}

// finish closes a connection whose two ways both ended in order.
func (c *proxyConn) finish() {
	c.once.Do(func() {
		close(c.done)
		c.client.Close()
		c.mu.Lock()
		c.target.Close()
		c.mu.Unlock()
	})
}

func (c *proxyConn) forget() {
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
}

// reset closes conn so that the peer gets an RST, not a FIN.
func reset(conn *net.TCPConn) {
	_ = conn.SetLinger(0)
	_ = conn.Close()
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF)
}

// link is a way's bandwidth cap: a schedule of when the link is next free.
type link struct {
	mu   sync.Mutex
	rate int64     // bytes per second; 0 is no cap
	free time.Time // when the bytes reserved so far have crossed
}

func (l *link) setRate(bytesPerSec int64) {
	l.mu.Lock()
	l.rate = max(bytesPerSec, 0)
	l.mu.Unlock()
}

// reserve books up to n bytes of the link and returns when they have
// crossed it and how many were booked; a zero time means no cap.
func (l *link) reserve(n int) (time.Time, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rate == 0 {
		return time.Time{}, n
	}
	slice := max(int(l.rate*int64(shapeSlice)/int64(time.Second)), 1)
	n = min(n, slice)
	start := time.Now()
	if l.free.After(start) {
		start = l.free
	}
	l.free = start.Add(time.Duration(int64(n) * int64(time.Second) / l.rate))
	return l.free, n
}
