package sidecar

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/protocol"
)

// An idle connection is closed after --idle-timeout; connections with
// requests in flight are not, however long Redis holds them: one whose take
// runs on its reader, and one that pipelined takes, whose reader waits for
// more input all along. Once answered, they are idle and closed in turn.
func TestIdleTimeoutClosesOnlyIdleConnections(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	// The Redis deadline outlasts the test: only Redis's pause holds the
	// takes, and only unpausing ends them. The idle timeout is far longer
	// than the steps between a connection's requests below.
	ts := startServer(t, Options{Store: st, AllowInline: true, RedisTimeout: time.Hour, IdleTimeout: time.Second})
	one, piped := ts.dial(t), ts.dial(t)
	waitRedisOK(t, one)
	waitRedisOK(t, piped)

	pauseWrites(t, r)
	one.send(inlineTake("o1", "idle", 10, ""))
	piped.send(inlineTake("p1", "idle", 10, ""), inlineTake("p2", "idle", 10, ""), `{"op":"ping","id":"p3"}`)
	waitFor(t, "the three takes to be in flight", func() bool { return ts.running() == 3 })

	// Sent after the takes, so idle for less time than they have been in
	// flight when it is closed.
	idle := ts.dial(t)
	if got := idle.call(`{"op":"ping"}`); !got.OK {
		t.Fatalf("ping on the idle connection = %+v", got)
	}
	idle.expectEOF()
	if got := metricValue(t, ts.Server, "quotad_connections_idle_closed_total", nil); got != 1 {
		t.Fatalf("idle closes = %v, want 1", got)
	}
	// The closed connection is untracked just after its client sees it
	// closed; the idle closes counted show the busy ones were not closed.
	waitFor(t, "the 2 busy connections to be the only ones open", func() bool { return ts.Conns() == 2 })

	unpause(t, r)
	if got := one.recv(); !got.OK || !got.Allowed || string(got.ID) != `"o1"` {
		t.Fatalf("held take on its reader = %+v", got)
	}
	for _, id := range []string{`"p1"`, `"p2"`, `"p3"`} {
		if got := piped.recv(); !got.OK || string(got.ID) != id {
			t.Fatalf("pipelined reply = %+v, want %s", got, id)
		}
	}
	one.expectEOF()
	piped.expectEOF()
	if got := metricValue(t, ts.Server, "quotad_connections_idle_closed_total", nil); got != 3 {
		t.Fatalf("idle closes = %v, want 3", got)
	}
}

// A client that keeps sending is never idle, even with nothing in flight
// between its requests; one that stops is closed.
func TestIdleTimeoutSparesAClientThatKeepsSending(t *testing.T) {
	st := openStore(t, "")
	// Far longer than the client's pause between two pings.
	ts := startServer(t, Options{Store: st, IdleTimeout: time.Second})
	busy, idle := ts.dial(t), ts.dial(t)
	if got := idle.call(`{"op":"ping"}`); !got.OK {
		t.Fatalf("ping = %+v", got)
	}
	// Ping until the other connection has been closed for being idle.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		idle.expectEOF()
	}()
	for n := 0; ; n++ {
		select {
		case <-closed:
			if got := busy.call(`{"op":"ping"}`); !got.OK {
				t.Fatalf("ping on the busy connection after %d pings = %+v", n, got)
			}
			if got := metricValue(t, ts.Server, "quotad_connections_idle_closed_total", nil); got != 1 {
				t.Fatalf("idle closes = %v, want 1", got)
			}
			return
		default:
		}
		if got := busy.call(`{"op":"ping"}`); !got.OK {
			t.Fatalf("ping %d on the busy connection = %+v", n, got)
		}
		time.Sleep(10 * time.Millisecond) // a client between two requests
	}
}

// One process cannot hold more than --max-conns-per-peer connections:
// the next one gets UNAVAILABLE naming the cap and its pid, while another
// process (a python3 child) still connects, up to its own cap.
func TestMaxConnsPerPeerRefusesOneProcessNotAnother(t *testing.T) {
	st := openStore(t, "")
	ts := startServer(t, Options{Store: st, MaxConns: 10, MaxConnsPerPeer: 2})
	c1, c2 := ts.dial(t), ts.dial(t)
	for _, c := range []*client{c1, c2} {
		if got := c.call(`{"op":"ping"}`); !got.OK {
			t.Fatalf("ping within the cap = %+v", got)
		}
	}
	c3 := ts.dial(t)
	got := c3.recv()
	checkCode(t, "third connection of this process", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "per process") || !strings.Contains(got.Message, "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("refusal %q does not name the per-process cap and pid %d", got.Message, os.Getpid())
	}
	c3.expectEOF()

	// While this process holds its two, a child opens three: two served,
	// the third refused.
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to connect from another process (make test-deps installs it): %v", err)
	}
	const script = `
import socket, sys
socks = []
for _ in range(3):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(sys.argv[1])
    socks.append(s)
for s in socks:
    try:
        s.sendall(b'{"op":"ping"}\n')
    except OSError:
        pass  # a refused connection may be closed already; its line is there
    print(s.makefile("rb").readline().decode().strip())
`
	out, err := exec.CommandContext(t.Context(), py, "-c", script, ts.sock).CombinedOutput()
	if err != nil {
		t.Fatalf("python3 child: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		t.Fatalf("child printed %q, want 3 reply lines", out)
	}
	for i, line := range lines[:2] {
		if got := decodeReply(t, line); !got.OK {
			t.Fatalf("child's connection %d = %+v, want served", i+1, got)
		}
	}
	got = decodeReply(t, lines[2])
	checkCode(t, "child's third connection", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "per process") || strings.Contains(got.Message, "pid "+strconv.Itoa(os.Getpid())+")") {
		t.Fatalf("child's refusal %q: want the per-process cap with the child's pid", got.Message)
	}
	if got := c2.call(`{"op":"ping"}`); !got.OK {
		t.Fatalf("ping on a served connection after the refusals = %+v", got)
	}
	if got := metricValue(t, ts.Server, "quotad_connections_refused_total", map[string]string{"reason": "max_conns_per_peer"}); got != 2 {
		t.Errorf("refusals by the per-peer cap = %v, want 2", got)
	}
	if got := metricValue(t, ts.Server, "quotad_connections_refused_total", map[string]string{"reason": "max_conns"}); got != 0 {
		t.Errorf("refusals by the global cap = %v, want 0", got)
	}

	// A closed connection gives its place back to its process.
	c1.nc.Close()
	waitFor(t, "a new connection of this process to be served", func() bool {
		c := ts.dial(t)
		defer c.nc.Close()
		_, _ = c.nc.Write([]byte(`{"op":"ping"}` + "\n"))
		got := c.recv()
		if !got.OK && got.Error != protocol.CodeUnavailable {
			t.Fatalf("new connection: %+v", got)
		}
		return got.OK
	})
}

// The global cap is counted under its own reason, and the default per-peer
// cap is half of it, so one process never takes every connection, but not
// below 64 unless the global cap is.
func TestMaxConnsRefusalIsCountedAndPerPeerDefault(t *testing.T) {
	st := openStore(t, "")
	ts := startServer(t, Options{Store: st, MaxConns: 2, MaxConnsPerPeer: 5})
	c1, c2 := ts.dial(t), ts.dial(t)
	for _, c := range []*client{c1, c2} {
		if got := c.call(`{"op":"ping"}`); !got.OK {
			t.Fatalf("ping within the limit = %+v", got)
		}
	}
	got := ts.dial(t).recv()
	checkCode(t, "third connection", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "connection limit reached (2)") {
		t.Fatalf("refusal %q does not name the global limit", got.Message)
	}
	if got := metricValue(t, ts.Server, "quotad_connections_refused_total", map[string]string{"reason": "max_conns"}); got != 1 {
		t.Errorf("refusals by the global cap = %v, want 1", got)
	}
	if got := metricValue(t, ts.Server, "quotad_connections_refused_total", map[string]string{"reason": "max_conns_per_peer"}); got != 0 {
		t.Errorf("refusals by the per-peer cap = %v, want 0", got)
	}

	for maxConns, want := range map[int]int{0: DefaultMaxConns / 2, 1000: 500, 100: 64, 64: 64, 3: 3, 1: 1} {
		s := NewServer(Options{MaxConns: maxConns})
		if got := s.opts.MaxConnsPerPeer; got != want {
			t.Errorf("--max-conns %d: per-peer cap %d, want %d", maxConns, got, want)
		}
		s.Close()
	}
}

// The per-peer count follows tracked connections exactly, and a peer whose
// pid is unknown (0: a pid namespace the sidecar cannot see) is under the
// global cap only, so such clients are never refused as if they were one
// process.
func TestTrackCountsPeersAndSparesUnknownPIDs(t *testing.T) {
	s := NewServer(Options{MaxConns: 4, MaxConnsPerPeer: 1})
	defer s.Close()
	a, b, u1, u2, u3 := &conn{}, &conn{}, &conn{}, &conn{}, &conn{}
	for _, step := range []struct {
		c    *conn
		pid  int32
		want trackResult
	}{
		{a, 42, tracked},
		{b, 42, overMaxConnsPerPeer},
		{u1, 0, tracked},
		{u2, 0, tracked},
		{b, 43, tracked},
		{u3, 0, overMaxConns},
	} {
		if got := s.track(step.c, step.pid); got != step.want {
			t.Fatalf("track(pid %d) = %d, want %d", step.pid, got, step.want)
		}
	}
	s.untrack(a)
	if got := s.track(&conn{}, 42); got != tracked {
		t.Fatalf("track(pid 42) after its connection closed = %d, want tracked", got)
	}
	for _, c := range []*conn{b, u1, u2} {
		s.untrack(c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.peers) != 1 || s.peers[42] != 1 || len(s.conns) != 1 {
		t.Fatalf("after untracking: peers %v, %d connections; want only pid 42's one", s.peers, len(s.conns))
	}
	clear(s.conns) // fake connections: nothing for Close to close
}
