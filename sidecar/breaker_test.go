package sidecar

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"quotad/integration/redistest"
	"quotad/protocol"
)

func TestDamperNeedsMoreProbesWhenTheBreakerFlaps(t *testing.T) {
	const every = time.Second
	d := damper{every: every}
	t0 := time.Unix(1_000_000, 0)

	// Redis unknown at start and found down: one good probe closes.
	d.opened(t0, false)
	if d.closeProbes() != 1 || !d.probeOK(t0.Add(every)) {
		t.Fatalf("a first outage: need %d probes, want 1 that closes", d.closeProbes())
	}
	closed := t0.Add(every)

	// Each reopening soon after a close doubles the probes needed, up to
	// maxCloseProbes.
	want := 1
	for i := range 8 {
		want = min(want*2, maxCloseProbes)
		at := closed.Add(every) // well within flapProbes intervals
		d.opened(at, true)
		if got := d.closeProbes(); got != want {
			t.Fatalf("reopening %d: need %d probes, want %d", i+1, got, want)
		}
		for p := 1; p < want; p++ {
			if d.probeOK(at.Add(time.Duration(p) * every)) {
				t.Fatalf("reopening %d: closed after %d of %d probes", i+1, p, want)
			}
		}
		closed = at.Add(time.Duration(want) * every)
		if !d.probeOK(closed) {
			t.Fatalf("reopening %d: still open after %d probes", i+1, want)
		}
	}

	// A failed probe restarts the count.
	d.opened(closed.Add(every), true)
	need := d.closeProbes()
	if need != maxCloseProbes {
		t.Fatalf("need %d, want the cap %d", need, maxCloseProbes)
	}
	for range need - 1 {
		d.probeOK(closed)
	}
	d.probeFailed()
	if d.probeOK(closed) {
		t.Fatal("closed right after a failed probe")
	}

	// An outage long after the last close is a new one: one probe again.
	d.opened(closed.Add(time.Hour), true)
	if d.closeProbes() != 1 {
		t.Fatalf("an outage long after the last: need %d probes, want 1", d.closeProbes())
	}
}

// procFDs counts this process's open file descriptors.
func procFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents)
}

// footprint is what an outage must not make grow without bound.
type footprint struct {
	goroutines int
	fds        int
	heap       uint64 // bytes in use
}

func measure(t *testing.T) footprint {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return footprint{goroutines: runtime.NumGoroutine(), fds: procFDs(t), heap: ms.HeapInuse}
}

// A hung Redis (SIGSTOP: connections open, nothing answered) costs one
// --redis-timeout; after that the breaker answers every take at once, the
// sidecar stays within bounds however many requests come, and the probe
// closes the breaker when Redis answers again.
func TestBreakerAnswersAtOnceWhileRedisHangsAndClosesWhenItAnswers(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true, RedisTimeout: 2 * time.Second})
	c := ts.dial(t)
	waitRedisOK(t, c)
	if got := c.call(inlineTake("w", "hang", 1000, "")); !got.OK || !got.Allowed {
		t.Fatalf("take with Redis up = %+v", got)
	}

	const conns, perConn = 20, 100
	clients := make([]*client, conns)
	for i := range clients {
		clients[i] = ts.dial(t)
	}
	waitFor(t, "the server to accept every connection", func() bool { return ts.Conns() == conns+1 })
	before := measure(t)

	r.Freeze(t)
	// The first take finds the breaker closed and waits out the deadline,
	// unless the probe was first to find Redis silent.
	got := c.call(inlineTake("1", "hang", 1000, `,"request_id":"first"`))
	checkCode(t, "the first take on a hung Redis", got, protocol.CodeUnavailable)
	waitFor(t, "the breaker to open", func() bool { return !st.Up() })

	// Every connection pipelines its takes; each is answered by the breaker.
	peak := before
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak.goroutines = max(peak.goroutines, runtime.NumGoroutine())
			peak.heap = max(peak.heap, ms.HeapInuse)
			select {
			case <-stopSampling:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	replies := make([][]string, conns)
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lines := make([]string, perConn)
			for j := range lines {
				lines[j] = inlineTake(strconv.Itoa(j), "hang-"+strconv.Itoa(i), 1000, `,"request_id":"r`+strconv.Itoa(j)+`"`)
			}
			if _, err := cl.nc.Write([]byte(strings.Join(lines, "\n") + "\n")); err != nil {
				replies[i] = []string{"write: " + err.Error()}
				return
			}
			_ = cl.nc.SetReadDeadline(time.Now().Add(waitTimeout))
			for range perConn {
				line, err := cl.r.ReadString('\n')
				if err != nil {
					replies[i] = append(replies[i], "read: "+err.Error())
					return
				}
				replies[i] = append(replies[i], line)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	peak.fds = max(peak.fds, procFDs(t))
	close(stopSampling)
	<-sampled
	for i, lines := range replies {
		if len(lines) != perConn {
			t.Fatalf("connection %d: %d replies, want %d: %v", i, len(lines), perConn, lines)
		}
		for _, line := range lines {
			got := decodeReply(t, line)
			if got.Error != protocol.CodeUnavailable || got.Message != ErrBreakerOpen.Error() {
				t.Fatalf("connection %d: take while the breaker is open = %s, want UNAVAILABLE %q", i, line, ErrBreakerOpen.Error())
			}
		}
	}
	t.Logf("%d takes answered by the open breaker in %v; goroutines %d -> peak %d, fds %d -> %d, heap %d -> peak %d KiB",
		conns*perConn, elapsed, before.goroutines, peak.goroutines, before.fds, peak.fds, before.heap>>10, peak.heap>>10)
	// Generous bounds. Were the takes waiting on Redis, each would hold its
	// goroutine for the whole deadline: conns*perConn of them at once. Taken
	// by the breaker, a request's goroutine ends as soon as it is scheduled.
	if limit := before.goroutines + conns + conns*perConn*3/4; peak.goroutines > limit {
		t.Errorf("goroutines peaked at %d during the outage, want at most %d", peak.goroutines, limit)
	}
	if limit := before.fds + 10; peak.fds > limit {
		t.Errorf("open file descriptors reached %d during the outage, want at most %d", peak.fds, limit)
	}
	if limit := before.heap + 64<<20; peak.heap > limit {
		t.Errorf("heap in use peaked at %d KiB during the outage, want at most %d KiB", peak.heap>>10, limit>>10)
	}
	checkCode(t, "peek while the breaker is open", c.call(`{"op":"peek","subject":"hang","limit":1000,"window_ms":60000}`), protocol.CodeUnavailable)
	if got := c.call(`{"op":"ping"}`); !got.OK || got.RedisOK {
		t.Fatalf("ping while the breaker is open = %+v, want redis_ok false", got)
	}

	r.Thaw(t)
	waitFor(t, "the probe to close the breaker", st.Up)
	if got := c.call(inlineTake("2", "hang", 1000, `,"request_id":"after"`)); !got.OK || !got.Allowed {
		t.Fatalf("take once Redis answers again = %+v", got)
	}
	// The sidecar holds few connections to Redis whatever the outage did.
	var fromSidecar int
	for _, line := range strings.Split(redisString(t, r, "CLIENT", "LIST"), "\n") {
		if strings.Contains(line, "cmd=") && !strings.Contains(line, "cmd=client") {
			fromSidecar++
		}
	}
	if fromSidecar > 8 {
		t.Errorf("%d connections to Redis after the outage, want a handful", fromSidecar)
	}
}

// A stopped Redis refuses connections: takes are UNAVAILABLE, the breaker
// opens, and the sidecar needs no restart once Redis is back.
func TestBreakerOpensWhenRedisStopsAndClosesWhenItIsBack(t *testing.T) {
	r := redistest.Start(t)
	addr := r.Addr()
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	r.Stop(t)
	waitFor(t, "the breaker to open", func() bool { return !st.Up() })
	for i := range 50 {
		got := c.call(inlineTake(strconv.Itoa(i), "stopped", 10, ""))
		if got.Error != protocol.CodeUnavailable || got.Message != ErrBreakerOpen.Error() {
			t.Fatalf("take %d with Redis stopped = %+v, want the breaker's UNAVAILABLE", i, got)
		}
	}
	startRedisAt(t, addr)
	waitFor(t, "the probe to close the breaker", st.Up)
	if got := c.call(inlineTake("b", "stopped", 10, "")); !got.OK || !got.Allowed || got.Used != 1 {
		t.Fatalf("take once Redis is back = %+v, want allowed with used 1", got)
	}
}

func redisString(t *testing.T, r *redistest.Server, args ...string) string {
	t.Helper()
	s, err := r.Do(t, args...).ToString()
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	return s
}

// Only the probe closes an open breaker: a call answered late, after the
// breaker opened, leaves it open and keeps the reason Redis is down.
func TestLateAnswerNeverClosesTheBreaker(t *testing.T) {
	st := &Store{kind: StoreRedis, log: zap.NewNop()}
	st.damper.every = time.Second
	st.setUp(true, true, nil)
	st.Observe("k", errors.New("connection reset"))
	if st.Up() {
		t.Fatal("a transport error left the breaker closed")
	}
	st.Observe("k", nil)
	if st.Up() || st.LastError() == nil {
		t.Fatalf("a late answer closed the breaker (up %v) or cleared why it opened (%v)", st.Up(), st.LastError())
	}
	st.setUp(true, true, nil)
	if !st.Up() || st.LastError() != nil {
		t.Fatalf("the probe did not close the breaker (up %v, last error %v)", st.Up(), st.LastError())
	}
}
