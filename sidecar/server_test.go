package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

func TestServeTakePeekPing(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	cfg, err := policy.ParseConfig([]byte("policies:\n  api:\n    limit: 3\n    window: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Store: st, Config: cfg, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)

	const take = `{"op":"take","id":1,"subject":"alice","policy":"api","cost":2,"request_id":"order-1"}`
	raw := c.callRaw(take)
	const head = `{"id":1,"ok":true,"allowed":true,"replay":false,"limit":3,"used":2,"remaining":1,"reset_ms":`
	if !strings.HasPrefix(raw, head) {
		t.Fatalf("first take = %s, want it to start %s", raw, head)
	}
	got := decodeReply(t, raw)
	if got.ResetMS < 1 || got.ResetMS > 60000 || got.RetryAfterMS != 0 {
		t.Fatalf("first take = %s: want reset_ms in 1..60000 and retry_after_ms 0", raw)
	}

	got = c.call(take)
	if !got.OK || !got.Allowed || !got.Replay || got.Used != 2 || got.Remaining != 1 {
		t.Fatalf("retry of order-1 = %+v, want a replay with used 2", got)
	}

	got = c.call(`{"op":"take","subject":"alice","policy":"api","cost":2,"request_id":"order-2"}`)
	if !got.OK || got.Allowed || got.Used != 2 || got.Remaining != 1 || got.RetryAfterMS < 1 || got.RetryAfterMS > 60000 || got.RetryAfterMS != got.ResetMS {
		t.Fatalf("take over the limit = %+v, want a denial with used 2 and retry_after_ms = reset_ms", got)
	}

	got = c.call(`{"op":"peek","id":"pk","subject":"alice","policy":"api"}`)
	if !got.OK || string(got.ID) != `"pk"` || got.Limit != 3 || got.Used != 2 || got.Remaining != 1 || got.ResetMS < 1 || got.ResetMS > 60000 {
		t.Fatalf("peek = %+v, want id pk, limit 3, used 2, remaining 1", got)
	}
	got = c.call(`{"op":"peek","subject":"nobody","policy":"api"}`)
	if !got.OK || got.Used != 0 || got.Remaining != 3 || got.ResetMS != 0 {
		t.Fatalf("peek of a subject without a window = %+v, want used 0, remaining 3, reset_ms 0", got)
	}

	if raw, want := c.callRaw(`{"op":"ping","id":"p"}`), `{"id":"p","ok":true,"store":"redis","redis_ok":true,"version":"test","ready":true}`; raw != want {
		t.Fatalf("ping = %s, want %s", raw, want)
	}

	rc := r.Client(t)
	n, err := rc.Do(t.Context(), rc.B().Exists().Key(luascript.FixedWindowKey(testPrefix, "api", "alice")).Build()).AsInt64()
	if err != nil || n != 1 {
		t.Fatalf("window key of alice: EXISTS = %d, %v", n, err)
	}
	redistest.AssertAllKeysHaveTTL(t, rc, testPrefix)
}

func TestShutdownDrainsInflightRequests(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	// The Redis deadline outlasts the test, so only Shutdown can end a take.
	ts := startServer(t, Options{Store: st, AllowInline: true, RedisTimeout: time.Hour})
	a, b := ts.dial(t), ts.dial(t)
	waitRedisOK(t, a)
	if got := b.call(`{"op":"ping"}`); !got.OK {
		t.Fatalf("ping on b = %+v", got)
	}

	pauseWrites(t, r)
	// Each take holds its connection's writer; the ping behind it stays in
	// the queue, which shows the take was read and started.
	a.send(inlineTake("a1", "drain", 10, ""), `{"op":"ping","id":"a2"}`)
	b.send(inlineTake("b1", "drain", 10, ""), `{"op":"ping","id":"b2"}`)
	waitFor(t, "both takes to be in flight", func() bool { return ts.everyQueueHolds(2, 1) })

	shutdown := make(chan error, 1)
	go func() {
		// Generous: the takes end when the test unpauses Redis, not before.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shutdown <- ts.Shutdown(ctx)
	}()
	waitFor(t, "the socket file to be removed", func() bool {
		_, err := os.Lstat(ts.sock)
		return errors.Is(err, os.ErrNotExist)
	})
	if nc, err := net.Dial("unix", ts.sock); err == nil {
		nc.Close()
		t.Fatal("a new connection was accepted during shutdown")
	}

	// Lines sent during the drain are read and answered, not cut off.
	a.send(inlineTake("a3", "drain", 10, ""))
	b.send(inlineTake("b3", "drain", 10, ""))
	waitFor(t, "the lines sent during the drain to be read", func() bool { return ts.everyQueueHolds(2, 2) })
	select {
	case err := <-shutdown:
		t.Fatalf("Shutdown returned %v while takes were in flight", err)
	default:
	}

	unpause(t, r)
	used := map[int64]bool{}
	for _, c := range []struct {
		cl   *client
		name string
	}{{a, "a"}, {b, "b"}} {
		got := c.cl.recv()
		if !got.OK || !got.Allowed || string(got.ID) != `"`+c.name+`1"` {
			t.Fatalf("in-flight take on %s = %+v, want its real reply (allowed)", c.name, got)
		}
		used[got.Used] = true
		if got := c.cl.recv(); !got.OK || got.Store != store.StoreRedis || string(got.ID) != `"`+c.name+`2"` {
			t.Fatalf("ping sent before the shutdown on %s = %+v", c.name, got)
		}
		got = c.cl.recv()
		checkCode(t, "take sent during the drain on "+c.name, got, protocol.CodeShuttingDown)
		if string(got.ID) != `"`+c.name+`3"` {
			t.Fatalf("take sent during the drain on %s has id %s", c.name, got.ID)
		}
		c.cl.expectEOF()
	}
	if !used[1] || !used[2] {
		t.Fatalf("the two takes reported used %v, want 1 and 2", used)
	}

	select {
	case err := <-shutdown:
		if err != nil {
			t.Fatalf("Shutdown = %v, want nil after a full drain", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Shutdown did not return after the drain")
	}
	if err := ts.waitServed(t); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve = %v, want ErrServerClosed", err)
	}
	if n := ts.Conns(); n != 0 {
		t.Fatalf("Conns() = %d after Shutdown, want 0", n)
	}
	// The takes answered SHUTTING_DOWN were not run.
	p, err := luascript.Peek(t.Context(), r.Client(t), limits.FixedWindow, luascript.Args{
		Key: luascript.FixedWindowKey(testPrefix, "", "drain"), Limit: 10, WindowMS: 60000, Strict: true,
	})
	if err != nil || p.Used != 2 {
		t.Fatalf("window after the drain: %+v, %v; want used 2", p, err)
	}
}

func TestShutdownDeadlineCutsOffInflightTake(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true, RedisTimeout: time.Hour})
	c := ts.dial(t)
	waitRedisOK(t, c)

	// Redis holds the take until the test ends, far past the deadline.
	pauseWrites(t, r)
	c.send(inlineTake("t1", "cut", 10, `,"request_id":"cut-1"`), `{"op":"ping","id":"t2"}`)
	waitFor(t, "the take to be in flight", func() bool { return ts.everyQueueHolds(1, 1) })

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := ts.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want the context's DeadlineExceeded", err)
	}

	got := c.recv()
	checkCode(t, "take cut off by the shutdown deadline", got, protocol.CodeShuttingDown)
	if string(got.ID) != `"t1"` || !strings.Contains(got.Message, "outcome is unknown") {
		t.Fatalf("take cut off by the shutdown deadline = %+v, want id t1 and a message saying the outcome is unknown", got)
	}
	if got := c.recv(); !got.OK || string(got.ID) != `"t2"` {
		t.Fatalf("ping behind the cut-off take = %+v", got)
	}
	c.expectEOF()
	if err := ts.waitServed(t); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve = %v, want ErrServerClosed", err)
	}
	waitFor(t, "every connection to close", func() bool { return ts.Conns() == 0 })
	if _, err := os.Lstat(ts.sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file after Shutdown: %v, want it removed", err)
	}
}

// A reply that is ready goes out even while a later request on the same
// connection is still waiting for Redis.
func TestReadyRepliesAreNotHeldBehindAPendingRequest(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true, RedisTimeout: time.Hour})
	c := ts.dial(t)
	waitRedisOK(t, c)

	pauseWrites(t, r)
	lines := make([]string, 0, 21)
	for i := range 20 {
		lines = append(lines, `{"op":"ping","id":`+strconv.Itoa(i)+`}`)
	}
	c.send(append(lines, inlineTake("last", "held", 10, ""))...)
	for i := range 20 {
		if got := c.recv(); !got.OK || string(got.ID) != strconv.Itoa(i) {
			t.Fatalf("reply %d = %+v, want the ping with id %d", i, got, i)
		}
	}
	// The reader may start the take just after the last ping's reply went
	// out; what matters is that the take is running, not answered, while
	// every ping reply has arrived.
	waitFor(t, "the take to be running", func() bool { return ts.running() == 1 })
	unpause(t, r)
	if got := c.recv(); !got.OK || !got.Allowed || string(got.ID) != `"last"` {
		t.Fatalf("take after Redis resumed = %+v", got)
	}
}

func TestBackpressureBoundsAClientThatDoesNotRead(t *testing.T) {
	const (
		inflight = 16
		n        = 50_000
	)
	r := redistest.Start(t)
	// The health probe queues behind the paused takes on the same
	// connection: with the default probe deadline it would open the breaker
	// while Redis holds them, and the takes started after that would be
	// refused, as they should be.
	st := openStoreTimeout(t, r.URL(), time.Hour)
	ts := startServer(t, Options{Store: st, AllowInline: true, MaxInflightPerConn: inflight, RedisTimeout: time.Hour})
	c := ts.dial(t)
	waitRedisOK(t, c)

	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, `{"op":"take","id":%d,"subject":"bp","limit":1000000000,"window_ms":600000}`+"\n", i)
	}
	data := buf.Bytes()

	// With Redis holding every take, a server that kept reading would start
	// one goroutine per line; a bounded one stops reading after a queue's
	// worth, and the client's writes block once the socket buffer is full.
	pauseWrites(t, r)
	base := runtime.NumGoroutine()
	written := 0
	for {
		_ = c.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		k, err := c.nc.Write(data[written:])
		written += k
		if err == nil {
			t.Fatalf("the server read all %d lines (%d bytes) while the client read no reply", n, len(data))
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("write: %v", err)
		}
		if k == 0 {
			break // no progress in a whole deadline: the server stopped reading
		}
	}
	waitFor(t, "the reply queue to fill", func() bool { return ts.everyQueueHolds(1, inflight) })
	// Per connection: the reader, the writer, and one goroutine per started
	// request: the queue's worth, the one the writer waits on and the one the
	// reader holds. The rest is slack for the runtime and rueidis.
	if extra := runtime.NumGoroutine() - base; extra > inflight+2+8 {
		t.Fatalf("%d goroutines more than before the burst, want at most %d", extra, inflight+2+8)
	}
	t.Logf("the server stopped reading after %d of %d bytes", written, len(data))

	unpause(t, r)
	wrote := make(chan error, 1)
	go func() {
		_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Minute))
		_, err := c.nc.Write(data[written:])
		wrote <- err
	}()
	for i := range n {
		got := c.recv()
		if !got.OK || !got.Allowed || string(got.ID) != strconv.Itoa(i) {
			t.Fatalf("reply %d = %+v, want take %d allowed", i, got, i)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatalf("writing the rest of the burst: %v", err)
	}
	p, err := luascript.Peek(t.Context(), r.Client(t), limits.FixedWindow, luascript.Args{
		Key: luascript.FixedWindowKey(testPrefix, "", "bp"), Limit: 1_000_000_000, WindowMS: 600000, Strict: true,
	})
	if err != nil || p.Used != n {
		t.Fatalf("window after the burst: %+v, %v; want used %d", p, err, n)
	}
}

func TestMaxConnsRefusesAndRecovers(t *testing.T) {
	st := openStore(t, "")
	ts := startServer(t, Options{Store: st, MaxConns: 2})
	c1, c2 := ts.dial(t), ts.dial(t)
	for _, c := range []*client{c1, c2} {
		if got := c.call(`{"op":"ping"}`); !got.OK {
			t.Fatalf("ping within the limit = %+v", got)
		}
	}

	c3 := ts.dial(t)
	got := c3.recv()
	checkCode(t, "third connection", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "connection limit") {
		t.Fatalf("third connection: message %q does not name the connection limit", got.Message)
	}
	c3.expectEOF()
	if got := c2.call(`{"op":"ping"}`); !got.OK {
		t.Fatalf("ping on a served connection after a refusal = %+v", got)
	}

	c1.nc.Close()
	waitFor(t, "a new connection to be served", func() bool {
		c := ts.dial(t)
		defer c.nc.Close()
		// A refused connection may be closed before the ping is written; its
		// error line is still there to read.
		_, _ = c.nc.Write([]byte(`{"op":"ping"}` + "\n"))
		got := c.recv()
		if !got.OK && got.Error != protocol.CodeUnavailable {
			t.Fatalf("new connection: %+v", got)
		}
		return got.OK
	})
}
