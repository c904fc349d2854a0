package sidecar

import (
	"bufio"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"quotad/integration/redistest"
	"quotad/luascript"
	"quotad/protocol"
)

// startRedisAt runs a fresh redis-server at addr, where a stopped redistest
// server listened: redistest cannot start a server again after Stop, and the
// sidecar has to find Redis back at the address it was given. The new server
// starts empty, like a Redis restarted without persistence.
func startRedisAt(t *testing.T, addr string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", "--port", port, "--bind", host, "--dir", t.TempDir(),
		"--save", "", "--appendonly", "no", "--protected-mode", "no")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	waitFor(t, "redis-server to answer at "+addr, func() bool {
		select {
		case <-exited:
			t.Fatalf("redis-server at %s exited (the port may have been taken)", addr)
		default:
		}
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(time.Second))
		if _, err := nc.Write([]byte("PING\r\n")); err != nil {
			return false
		}
		line, _ := bufio.NewReader(nc).ReadString('\n')
		return line == "+PONG\r\n"
	})
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
	if !strings.Contains(got.Message, "outcome is unknown") && got.Message != ErrBreakerOpen.Error() {
		t.Fatalf("take with Redis stopped: message %q says neither that the outcome is unknown nor that the breaker is open", got.Message)
	}
	checkCode(t, "peek with Redis stopped", c.call(`{"op":"peek","subject":"down","limit":10,"window_ms":60000}`), protocol.CodeUnavailable)
	waitFor(t, "ping to report redis_ok false", func() bool {
		got := c.call(`{"op":"ping"}`)
		return got.OK && !got.RedisOK
	})

	startRedisAt(t, addr)
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

	st := openStore(t, url) // fails the test if OpenStore returns an error
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	got := c.call(inlineTake("1", "late", 10, `,"request_id":"late-1"`))
	checkCode(t, "take before Redis came up", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "not connected") {
		t.Fatalf("take before Redis came up: message %q does not say the sidecar is not connected", got.Message)
	}
	if got := c.call(`{"op":"ping"}`); !got.OK || got.RedisOK || got.Store != StoreRedis {
		t.Fatalf("ping before Redis came up = %+v, want store redis, redis_ok false", got)
	}

	startRedisAt(t, addr)
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
	st, err := OpenStore(StoreOptions{})
	if err != nil {
		t.Fatalf("OpenStore without a URL: %v", err)
	}
	t.Cleanup(st.Close)
	if st.Kind() != StoreEmbedded {
		t.Fatalf("Kind() = %q, want %q", st.Kind(), StoreEmbedded)
	}
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	if got := c.call(`{"op":"ping"}`); got.Store != StoreEmbedded {
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

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"redis://user:secret@host:6379/0", "redis://user:xxxxx@host:6379/0"},
		{"redis://:secret@host:6379", "redis://:xxxxx@host:6379"},
		{"rediss://user:secret@host:6380/0?dial_timeout=1s", "rediss://user:xxxxx@host:6380/0?dial_timeout=1s"},
		{"unix://user:secret@/run/redis.sock?db=1", "unix://user:xxxxx@/run/redis.sock?db=1"},
		{"redis://user:p%40ss-secret@host", "redis://user:xxxxx@host"},
		{"redis://host:6379?password=secret&client_name=q", "redis://host:6379?client_name=q&password=xxxxx"},
		{"redis://host:6379?Password=secret", "redis://host:6379?Password=xxxxx"},
		{"redis://host:6379?sentinel_pass=secret", "redis://host:6379?sentinel_pass=xxxxx"},
		{"redis://user@host:6379/1", "redis://user@host:6379/1"},
		{"redis://host:6379", "redis://host:6379"},
		{"", ""},
		// Not parseable: only the scheme is left.
		{"redis://user:sec%zzret@host", "redis://(unparseable)"},
		{"redis://user:secret@host:port", "redis://(unparseable)"},
		{"user:secret@host:6379/0 trailing\x7f", "(unparseable)"},
		// Without "//" the password is not in the user info.
		{"redis:user:secret@host", "redis:(opaque)"},
		{"user:secret@host:6379", "user:(opaque)"},
	} {
		got := RedactURL(tc.in)
		if got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "secret") {
			t.Errorf("RedactURL(%q) = %q shows the password", tc.in, got)
		}
	}
}

func TestOpenStoreErrorsDoNotShowThePassword(t *testing.T) {
	for _, u := range []string{
		"redis://user:secret%zz@host:6379", // a % that is not an escape
		"redis://user:sec ret@host:6379",
		"user:secret@host:6379", // the scheme forgotten
		"redis://user:secret@host:6379/notanumber",
	} {
		st, err := OpenStore(StoreOptions{RedisURL: u})
		if err == nil {
			st.Close()
			t.Errorf("OpenStore(%q) succeeded, want a parse error", u)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "secret") || strings.Contains(msg, "sec ret") || !strings.Contains(msg, "--redis-url") {
			t.Errorf("OpenStore(%q) = %q: want an error naming --redis-url without the password", u, msg)
		}
	}
}

// An operator alerting on "redis is down" must see it when Redis is already
// unreachable at start, not only after it was once up.
func TestRedisDownIsLoggedWhenUnreachableAtStart(t *testing.T) {
	r := redistest.Start(t)
	url := r.URL()
	r.Stop(t)

	core, logs := observer.New(zap.InfoLevel)
	st, err := OpenStore(StoreOptions{RedisURL: url, Timeout: time.Second, ProbeInterval: 20 * time.Millisecond, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		waitDelayedRefreshes(t)
	})
	waitFor(t, `a "redis is down" log line`, func() bool {
		return logs.FilterMessage("redis is down").Len() > 0
	})
	if st.Up() {
		t.Fatal("Up() is true while Redis is unreachable")
	}
}
