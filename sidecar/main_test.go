package sidecar

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"quotad/integration/redistest"
	"quotad/protocol"
	"quotad/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait for a condition. It is far above what any
// condition needs on a loaded machine: it only decides how long a broken test
// takes to fail, never whether a working one passes.
const waitTimeout = 20 * time.Second

// testPrefix is the key prefix of every server in these tests.
const testPrefix = "qt:"

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openStore opens a store on url ("" for the embedded one) and closes it when
// the test ends. The probe runs often so that health changes show quickly.
func openStore(t *testing.T, url string) *store.Store {
	t.Helper()
	return openStoreTimeout(t, url, time.Second)
}

// openStoreTimeout is openStore with the probe's deadline set.
func openStoreTimeout(t *testing.T, url string, timeout time.Duration) *store.Store {
	t.Helper()
	st, err := store.OpenStore(store.StoreOptions{
		RedisURL:      url,
		Timeout:       timeout,
		ProbeInterval: 20 * time.Millisecond,
		Logger:        zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatalf("OpenStore(%q): %v", url, err)
	}
	t.Cleanup(func() {
		st.Close()
		waitDelayedRefreshes(t)
	})
	return st
}

// delayedRefresh is the function of the goroutine a failed rueidis.NewClient
// leaves behind. Before falling back to a single-node client, NewClient
// probes the address as a cluster; when the dial fails, the probe's close
// hook schedules a topology refresh through singleflight DelayDo, which
// sleeps a random delay of up to one second (clusterRefreshAutoMaxDelay for
// fewer than 100 nodes), finds no connection to refresh and returns. The
// client that owns it was never returned, so store.Store.Close cannot stop it: it
// is slow to exit, not leaked. goleak's own retries span about 0.4s, so the
// tests of a store that could not connect wait for it here, and a refresh
// still sleeping after waitTimeout fails the test as the leak it would be.
const delayedRefresh = "github.com/redis/rueidis.(*call).DelayDo.func1"

func waitDelayedRefreshes(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		stacks := allStacks()
		if !strings.Contains(stacks, delayedRefresh) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("rueidis refresh goroutines still running %v after the store closed:\n%s", waitTimeout, stacks)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func allStacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// testServer is a Server serving a Unix socket in a short temporary
// directory (sun_path holds 107 bytes; t.TempDir paths can be longer).
type testServer struct {
	*Server
	sock     string
	served   chan struct{}
	serveErr error
}

func startServer(t testing.TB, opts Options) *testServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "qs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "q.sock")
	l, err := Listen(sock, 0o600)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	if opts.Version == "" {
		opts.Version = "test"
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = testPrefix
	}
	ts := &testServer{Server: NewServer(opts), sock: sock, served: make(chan struct{})}
	go func() {
		ts.serveErr = ts.Serve(context.Background(), l)
		close(ts.served)
	}()
	t.Cleanup(func() {
		ts.Close()
		ts.waitServed(t)
		// Every handler has returned once its connection is untracked, so
		// nothing logs to t after this.
		waitFor(t, "every connection to close", func() bool { return ts.Conns() == 0 })
	})
	return ts
}

// waitServed waits for Serve to return and returns its error.
func (ts *testServer) waitServed(t testing.TB) error {
	t.Helper()
	select {
	case <-ts.served:
		return ts.serveErr
	case <-time.After(waitTimeout):
		t.Fatalf("Serve did not return within %v", waitTimeout)
		return nil
	}
}

// queueLens returns, for every open connection, how many replies wait
// behind the first unwritten one: requests read and started that an
// earlier request's reply holds up.
func (ts *testServer) queueLens() []int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var lens []int
	for c := range ts.conns {
		lens = append(lens, max(int(c.unwritten.Load())-1, 0))
	}
	return lens
}

// running is the number of requests waiting for Redis on all connections.
func (ts *testServer) running() int64 {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var n int64
	for c := range ts.conns {
		n += c.running.Load()
	}
	return n
}

// everyQueueHolds reports whether exactly conns connections are open and
// each has at least n replies waiting behind the first (queueLens).
func (ts *testServer) everyQueueHolds(conns, n int) bool {
	lens := ts.queueLens()
	if len(lens) != conns {
		return false
	}
	for _, l := range lens {
		if l < n {
			return false
		}
	}
	return true
}

// client speaks the protocol line by line over a raw connection, so tests
// can pipeline, stop reading, and see exactly what the server sends.
type client struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func (ts *testServer) dial(t *testing.T) *client {
	t.Helper()
	nc, err := net.Dial("unix", ts.sock)
	if err != nil {
		t.Fatalf("dial %s: %v", ts.sock, err)
	}
	t.Cleanup(func() { nc.Close() })
	return &client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// send writes each line with its newline in one write.
func (c *client) send(lines ...string) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(waitTimeout))
	if _, err := io.WriteString(c.nc, strings.Join(lines, "\n")+"\n"); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// recvRaw reads one reply line, without its newline.
func (c *client) recvRaw() string {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	line, err := c.r.ReadString('\n')
	if err != nil {
		c.t.Fatalf("read reply: %v (partial %q)", err, line)
	}
	return strings.TrimSuffix(line, "\n")
}

func (c *client) recv() protocol.Reply {
	c.t.Helper()
	return decodeReply(c.t, c.recvRaw())
}

func (c *client) call(line string) protocol.Reply {
	c.t.Helper()
	c.send(line)
	return c.recv()
}

func (c *client) callRaw(line string) string {
	c.t.Helper()
	c.send(line)
	return c.recvRaw()
}

// expectEOF checks that the server closed the connection after its last
// reply, with nothing more to read.
func (c *client) expectEOF() {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	line, err := c.r.ReadString('\n')
	if !errors.Is(err, io.EOF) || line != "" {
		c.t.Fatalf("want the connection closed, got %q, %v", line, err)
	}
}

func decodeReply(t testing.TB, line string) protocol.Reply {
	t.Helper()
	var r protocol.Reply
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("reply %q is not JSON: %v", line, err)
	}
	return r
}

// waitRedisOK polls ping until the store reports Redis up: the store
// connects in the background, so the first requests may find it connecting.
func waitRedisOK(t *testing.T, c *client) {
	t.Helper()
	waitFor(t, "ping to report redis_ok", func() bool {
		r := c.call(`{"op":"ping"}`)
		return r.OK && r.RedisOK
	})
}

// inlineTake is a take line with an inline limit of a one-minute window.
func inlineTake(id, subject string, limit int64, extra string) string {
	return `{"op":"take","id":"` + id + `","subject":"` + subject + `","limit":` + strconv.FormatInt(limit, 10) + `,"window_ms":60000` + extra + `}`
}

// pauseWrites makes Redis hold every write command, scripts included, until
// unpause; reads such as PING still run. The pause is long and lifted
// explicitly, so a test never depends on it ending by itself at the right
// moment. It is lifted at the end of the test in any case.
func pauseWrites(t *testing.T, r *redistest.Server) {
	t.Helper()
	if err := r.Do(t, "CLIENT", "PAUSE", "120000", "WRITE").Error(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	t.Cleanup(func() { unpause(t, r) })
}

func unpause(t *testing.T, r *redistest.Server) {
	t.Helper()
	if err := r.Do(t, "CLIENT", "UNPAUSE").Error(); err != nil {
		t.Errorf("CLIENT UNPAUSE: %v", err)
	}
}

func checkCode(t *testing.T, what string, r protocol.Reply, want protocol.Code) {
	t.Helper()
	if r.OK || r.Error != want {
		t.Fatalf("%s: got %+v, want error %s", what, r, want)
	}
}

// batched is how many decisions the server has sent to Redis in batches
// (the sum of quotad_redis_batch_requests).
func (ts *testServer) batched(t testing.TB) int64 {
	t.Helper()
	n, _ := ts.batches(t)
	return n
}

// batches is how many decisions the server has sent to Redis in batches,
// and in how many batches.
func (ts *testServer) batches(t testing.TB) (decisions, batches int64) {
	t.Helper()
	mfs, err := ts.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "quotad_redis_batch_requests" {
			h := mf.GetMetric()[0].GetHistogram()
			return int64(h.GetSampleSum()), int64(h.GetSampleCount())
		}
	}
	t.Fatal("no quotad_redis_batch_requests metric")
	return 0, 0
}
