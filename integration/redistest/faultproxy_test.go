package redistest_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"quotad/integration/redistest"
)

// proxied is one connection through a FaultProxy with both of its ends in
// the test's hands: client dialled the proxy, server is what the proxy
// dialled.
type proxied struct {
	client, server net.Conn
}

// targetListener is the proxy's target: the test accepts its connections.
func targetListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func dialThrough(t *testing.T, p *redistest.FaultProxy, ln net.Listener) proxied {
	t.Helper()
	client, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	server, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept the proxy's connection: %v", err)
	}
	t.Cleanup(func() { server.Close() })
	return proxied{client: client, server: server}
}

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// readFullBy reads len(want) bytes from c, failing the test after a
// generous deadline, and checks them.
func readFullBy(t *testing.T, c net.Conn, want []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read %d bytes: %v", len(want), err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("bytes differ after the proxy (%d bytes)", len(want))
	}
}

func TestFaultProxyPassesBytesIntactBothWaysAndCloses(t *testing.T) {
	ln := targetListener(t)
	p := redistest.StartFaultProxy(t, ln.Addr().String())
	c := dialThrough(t, p, ln)
	up, down := randomBytes(1<<20, 1), randomBytes(1<<20, 2)
	errs := make(chan error, 2)
	go func() { _, err := c.client.Write(up); errs <- err }()
	go func() { _, err := c.server.Write(down); errs <- err }()
	readFullBy(t, c.server, up)
	readFullBy(t, c.client, down)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	if got := p.Bytes(redistest.ToServer); got != int64(len(up)) {
		t.Fatalf("Bytes(ToServer) = %d, want %d", got, len(up))
	}
	if got := p.Bytes(redistest.Both); got != int64(len(up)+len(down)) {
		t.Fatalf("Bytes(Both) = %d, want %d", got, len(up)+len(down))
	}
	// An orderly close travels as a FIN, after the bytes before it.
	if _, err := c.client.Write([]byte("bye")); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := c.client.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatalf("close write: %v", err)
	}
	_ = c.server.SetReadDeadline(time.Now().Add(30 * time.Second))
	rest, err := io.ReadAll(c.server)
	if err != nil || string(rest) != "bye" {
		t.Fatalf("after the client's close the target read %q, %v; want \"bye\" then EOF", rest, err)
	}
}

func TestFaultProxyLatencyDelaysEveryChunkInOrder(t *testing.T) {
	const latency = 150 * time.Millisecond
	ln := targetListener(t)
	p := redistest.StartFaultProxy(t, ln.Addr().String())
	c := dialThrough(t, p, ln)
	p.SetLatency(redistest.ToClient, latency)

	// Three replies written 40 ms apart each arrive at least latency after
	// they were written, in order.
	const replies = 3
	sent := make(chan time.Time, replies)
	go func() {
		for i := range replies {
			sent <- time.Now()
			_, _ = c.server.Write([]byte{byte('a' + i)})
			time.Sleep(40 * time.Millisecond)
		}
	}()
	for i := range replies {
		readFullBy(t, c.client, []byte{byte('a' + i)})
		if took := time.Since(<-sent); took < latency {
			t.Fatalf("reply %d arrived %v after it was written, want at least %v", i, took, latency)
		}
	}

	// The other way is not delayed by it, and has a latency of its own.
	p.SetLatency(redistest.ToServer, 2*latency)
	start := time.Now()
	if _, err := c.client.Write([]byte("cmd")); err != nil {
		t.Fatalf("write: %v", err)
	}
	readFullBy(t, c.server, []byte("cmd"))
	if took := time.Since(start); took < 2*latency {
		t.Fatalf("a command arrived after %v, want at least %v", took, 2*latency)
	}
}

// TestFaultProxyLatencyIsADelayLine shows that latency does not throttle:
// bytes written one after another while the first is still delayed are all
// read into the delay line at once, where a connection that slept before
// each write would hold one chunk at a time.
func TestFaultProxyLatencyIsADelayLine(t *testing.T) {
	const latency = 2 * time.Second // far longer than the writes take
	ln := targetListener(t)
	p := redistest.StartFaultProxy(t, ln.Addr().String())
	c := dialThrough(t, p, ln)
	p.SetLatency(redistest.ToClient, latency)
	const replies = 3
	sent := make(chan time.Time, replies)
	for i := range replies {
		sent <- time.Now()
		if _, err := c.server.Write([]byte{byte('a' + i)}); err != nil {
			t.Fatalf("write: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline := time.Now().Add(30 * time.Second)
	for p.Buffered(redistest.ToClient) != replies {
		if time.Now().After(deadline) {
			t.Fatalf("Buffered(ToClient) = %d, want all %d bytes in the delay line at once", p.Buffered(redistest.ToClient), replies)
		}
		time.Sleep(time.Millisecond)
	}
	for i := range replies {
		readFullBy(t, c.client, []byte{byte('a' + i)})
		if took := time.Since(<-sent); took < latency {
			t.Fatalf("reply %d arrived %v after it was written, want at least %v", i, took, latency)
		}
	}
	if got := p.Buffered(redistest.Both); got != 0 {
		t.Fatalf("Buffered(Both) = %d once everything was read, want 0", got)
	}
}

func TestFaultProxyBandwidthCapsEachWay(t *testing.T) {
	const (
		rate = 100 << 10 // bytes per second
		size = 60 << 10  // so at least 600 ms
	)
	ln := targetListener(t)
	p := redistest.StartFaultProxy(t, ln.Addr().String())
	c := dialThrough(t, p, ln)
	p.SetBandwidth(redistest.Both, rate)
	for _, way := range []struct {
		name     string
		from, to net.Conn
	}{{"to server", c.client, c.server}, {"to client", c.server, c.client}} {
		data := randomBytes(size, uint64(len(way.name)))
		start := time.Now()
		go func() { _, _ = way.from.Write(data) }()
		readFullBy(t, way.to, data)
		want := time.Duration(size) * time.Second / rate
		if took := time.Since(start); took < want {
			t.Fatalf("%s: %d bytes crossed a %d B/s link in %v, want at least %v", way.name, size, rate, took, want)
		}
	}
	// Lifting the cap lets the bytes through unshaped again.
	p.SetBandwidth(redistest.Both, 0)
	data := randomBytes(1<<20, 3)
	go func() { _, _ = c.client.Write(data) }()
	readFullBy(t, c.server, data)
}

func TestFaultProxyBlackholeHoldsBytesUntilItHeals(t *testing.T) {
	ln := targetListener(t)
	p := redistest.StartFaultProxy(t, ln.Addr().String())
	c := dialThrough(t, p, ln)
	p.Blackhole(true)
	if _, err := c.client.Write([]byte("held")); err != nil {
		t.Fatalf("write into the blackhole: %v", err)
	}
	if _, err := c.server.Write([]byte("back")); err != nil {
		t.Fatalf("write into the blackhole: %v", err)
	}
	for _, conn := range []net.Conn{c.server, c.client} {
		_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, err := conn.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read through a blackhole = %d bytes, %v; want nothing until the deadline", n, err)
		}
	}
	if got := p.Conns(); got != 1 {
		t.Fatalf("Conns() = %d in a blackhole, want 1: connections stay open", got)
	}
	p.Blackhole(false)
	readFullBy(t, c.server, []byte("held"))
	readFullBy(t, c.client, []byte("back"))
}

func TestFaultProxyResetSendsRSTToBothSides(t *testing.T) {
	ln := targetListener(t)
	p := redistest.StartFaultProxy(t, ln.Addr().String())
	c := dialThrough(t, p, ln)
	p.Reset()
	for name, conn := range map[string]net.Conn{"client": c.client, "target": c.server} {
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%s read after Reset: %v, want a connection reset", name, err)
		}
	}
	// New connections are accepted as before.
	c = dialThrough(t, p, ln)
	if _, err := c.client.Write([]byte("again")); err != nil {
		t.Fatalf("write: %v", err)
	}
	readFullBy(t, c.server, []byte("again"))
}

func TestFaultProxyRefuseRefusesNewConnectionsOnly(t *testing.T) {
	ln := targetListener(t)
	p := redistest.StartFaultProxy(t, ln.Addr().String())
	c := dialThrough(t, p, ln)
	if err := p.Refuse(true); err != nil {
		t.Fatalf("Refuse(true): %v", err)
	}
	if conn, err := net.Dial("tcp", p.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
		if conn != nil {
			conn.Close()
		}
		t.Fatalf("dial while refusing: %v, want connection refused", err)
	}
	if _, err := c.client.Write([]byte("still")); err != nil {
		t.Fatalf("write on an open connection while refusing: %v", err)
	}
	readFullBy(t, c.server, []byte("still"))
	if err := p.Refuse(false); err != nil {
		t.Fatalf("Refuse(false): %v", err)
	}
	c = dialThrough(t, p, ln)
	if _, err := c.client.Write([]byte("new")); err != nil {
		t.Fatalf("write: %v", err)
	}
	readFullBy(t, c.server, []byte("new"))
	if got := p.Accepted(); got != 2 {
		t.Fatalf("Accepted() = %d, want 2", got)
	}
}

// TestFaultProxyCloseEndsEveryConnection closes a proxy with connections
// held in a blackhole, behind latency and a bandwidth cap: every
// connection ends, and goleak (TestMain) finds no goroutine of it left.
func TestFaultProxyCloseEndsEveryConnection(t *testing.T) {
	ln := targetListener(t)
	p, err := redistest.NewFaultProxy(ln.Addr().String())
	if err != nil {
		t.Fatalf("NewFaultProxy: %v", err)
	}
	p.SetLatency(redistest.Both, time.Hour)
	p.SetBandwidth(redistest.ToClient, 1)
	var conns []proxied
	for range 3 {
		c := dialThrough(t, p, ln)
		_, _ = c.client.Write([]byte("pending"))
		conns = append(conns, c)
	}
	p.Blackhole(true)
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, c := range conns {
		_ = c.client.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.client.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after Close: %v, want the connection ended", err)
		}
	}
	if got := p.Conns(); got != 0 {
		t.Fatalf("Conns() = %d after Close, want 0", got)
	}
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Fatal("dial after Close succeeded")
	}
}

func TestFaultProxyInFrontOfRedis(t *testing.T) {
	const latency = 100 * time.Millisecond
	s := redistest.Start(t)
	p := redistest.StartFaultProxy(t, s.Addr())
	c := p.Client(t)
	p.SetLatency(redistest.ToClient, latency)
	start := time.Now()
	if got, err := c.Do(t.Context(), c.B().Ping().Build()).ToString(); err != nil || got != "PONG" {
		t.Fatalf("PING through the proxy = %q, %v", got, err)
	}
	if took := time.Since(start); took < latency {
		t.Fatalf("PING behind %v of latency answered in %v", latency, took)
	}
	if got := p.Bytes(redistest.ToClient); got == 0 {
		t.Fatal("no byte from redis-server crossed the proxy")
	}
}
