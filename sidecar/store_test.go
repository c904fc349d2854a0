package sidecar

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/luascript"
	"quotad/protocol"
	"quotad/store"
)

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
			if got.Error != protocol.CodeUnavailable || got.Message != store.ErrBreakerOpen.Error() {
				t.Fatalf("connection %d: take while the breaker is open = %s, want UNAVAILABLE %q", i, line, store.ErrBreakerOpen.Error())
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
		if got.Error != protocol.CodeUnavailable || got.Message != store.ErrBreakerOpen.Error() {
			t.Fatalf("take %d with Redis stopped = %+v, want the breaker's UNAVAILABLE", i, got)
		}
	}
	redistest.StartAt(t, addr)
	waitFor(t, "the probe to close the breaker", st.Up)
	if got := c.call(inlineTake("b", "stopped", 10, "")); !got.OK || !got.Allowed || got.Used != 1 {
		t.Fatalf("take once Redis is back = %+v, want allowed with used 1", got)
	}
}

func TestRedisDownAndBackWithoutRestartingTheSidecar(t *testing.T) {
	r := redistest.Start(t)
	addr := r.Addr()
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	if got := c.call(inlineTake("1", "down", 10, `,"request_id":"before"`)); !got.OK || !got.Allowed {
		t.Fatalf("take with Redis up = %+v", got)
	}

	r.Stop(t)
	got := c.call(inlineTake("2", "down", 10, `,"request_id":"during"`))
	checkCode(t, "take with Redis stopped", got, protocol.CodeUnavailable)
	// Either the take met the refused connection (outcome unknown) or the
	// probe had already opened the breaker (not run).
	if !strings.Contains(got.Message, "outcome is unknown") && got.Message != store.ErrBreakerOpen.Error() {
		t.Fatalf("take with Redis stopped: message %q says neither that the outcome is unknown nor that the breaker is open", got.Message)
	}
	checkCode(t, "peek with Redis stopped", c.call(`{"op":"peek","subject":"down","limit":10,"window_ms":60000}`), protocol.CodeUnavailable)
	waitFor(t, "ping to report redis_ok false", func() bool {
		got := c.call(`{"op":"ping"}`)
		return got.OK && !got.RedisOK
	})

	redistest.StartAt(t, addr)
	// The first calls after the restart may still meet the broken connection:
	// those are UNAVAILABLE, and the same request_id makes the retry safe.
	waitFor(t, "a take to succeed again", func() bool {
		got := c.call(inlineTake("3", "down", 10, `,"request_id":"after"`))
		if !got.OK {
			if got.Error != protocol.CodeUnavailable {
				t.Fatalf("take while Redis comes back = %+v", got)
			}
			return false
		}
		// The new server is empty: however many attempts reached it, the
		// request_id was consumed once.
		if !got.Allowed || got.Used != 1 {
			t.Fatalf("take after Redis came back = %+v, want allowed with used 1", got)
		}
		return true
	})
	waitRedisOK(t, c)
}

func TestStoreStartsWithoutRedisAndConnectsWhenItComesUp(t *testing.T) {
	r := redistest.Start(t)
	addr, url := r.Addr(), r.URL()
	r.Stop(t)

	st := openStore(t, url) // fails the test if store.OpenStore returns an error
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	got := c.call(inlineTake("1", "late", 10, `,"request_id":"late-1"`))
	checkCode(t, "take before Redis came up", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "not connected") {
		t.Fatalf("take before Redis came up: message %q does not say the sidecar is not connected", got.Message)
	}
	if got := c.call(`{"op":"ping"}`); !got.OK || got.RedisOK || got.Store != store.StoreRedis {
		t.Fatalf("ping before Redis came up = %+v, want store redis, redis_ok false", got)
	}

	redistest.StartAt(t, addr)
	waitFor(t, "a take to succeed once Redis is up", func() bool {
		got := c.call(inlineTake("2", "late", 10, `,"request_id":"late-1"`))
		if !got.OK {
			if got.Error != protocol.CodeUnavailable {
				t.Fatalf("take while Redis comes up = %+v", got)
			}
			return false
		}
		if !got.Allowed || got.Used != 1 {
			t.Fatalf("take once Redis is up = %+v, want allowed with used 1", got)
		}
		return true
	})
	waitRedisOK(t, c)
}

func TestEmbeddedStore(t *testing.T) {
	// Zero options, as the CLI runs without --redis-url.
	st, err := store.OpenStore(store.StoreOptions{})
	if err != nil {
		t.Fatalf("OpenStore without a URL: %v", err)
	}
	t.Cleanup(st.Close)
	if st.Kind() != store.StoreEmbedded {
		t.Fatalf("Kind() = %q, want %q", st.Kind(), store.StoreEmbedded)
	}
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	if got := c.call(`{"op":"ping"}`); got.Store != store.StoreEmbedded {
		t.Fatalf("ping = %+v, want store embedded", got)
	}

	take := inlineTake("1", "emb", 5, `,"cost":2,"request_id":"emb-1"`)
	if got := c.call(take); !got.OK || !got.Allowed || got.Replay || got.Used != 2 || got.ResetMS < 1 || got.ResetMS > 60000 {
		t.Fatalf("first take = %+v, want allowed with used 2", got)
	}
	if got := c.call(take); !got.OK || !got.Allowed || !got.Replay || got.Used != 2 {
		t.Fatalf("retry = %+v, want a replay with used 2", got)
	}
	if got := c.call(`{"op":"peek","subject":"emb","limit":5,"window_ms":60000}`); !got.OK || got.Used != 2 || got.Remaining != 3 {
		t.Fatalf("peek = %+v, want used 2, remaining 3", got)
	}

	// TTLs follow the wall clock: a short window ends by itself, with no
	// command moving a clock forward.
	short := `{"op":"take","subject":"short","limit":1,"window_ms":300}`
	if got := c.call(short); !got.OK || !got.Allowed || got.Used != 1 || got.ResetMS > 300 {
		t.Fatalf("take in a 300ms window = %+v, want allowed with reset_ms at most 300", got)
	}
	rc, err := st.Client()
	if err != nil {
		t.Fatal(err)
	}
	key := luascript.FixedWindowKey(testPrefix, "", "short")
	pttl := func() int64 {
		n, err := rc.Do(t.Context(), rc.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", key, err)
		}
		return n
	}
	if n := pttl(); n == -1 {
		t.Fatalf("the window has no TTL")
	}
	waitFor(t, "the 300ms window to expire", func() bool { return pttl() == -2 })
	if got := c.call(short); !got.OK || !got.Allowed || got.Used != 1 {
		t.Fatalf("take after the window ended = %+v, want allowed in a new window", got)
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

func redisString(t *testing.T, r *redistest.Server, args ...string) string {
	t.Helper()
	s, err := r.Do(t, args...).ToString()
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	return s
}
