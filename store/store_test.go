package store

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
)

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
		redistest.WaitDelayedRefreshes(t)
	})
	waitFor(t, `a "redis is down" log line`, func() bool {
		return logs.FilterMessage("redis is down").Len() > 0
	})
	if st.Up() {
		t.Fatal("Up() is true while Redis is unreachable")
	}
}

// Started closes once the first connection attempt has an outcome: with
// Redis there, the store is up by then; with Redis gone, it is known down
// and says why.
func TestStartedAfterTheFirstConnectionAttempt(t *testing.T) {
	r := redistest.Start(t)
	gone := redistest.Start(t)
	goneURL := gone.URL()
	gone.Stop(t)
	for _, tc := range []struct {
		url string
		up  bool
	}{{r.URL(), true}, {goneURL, false}} {
		st, err := OpenStore(StoreOptions{RedisURL: tc.url, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-st.Started():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Started still open after 10s", tc.url)
		}
		_, cerr := st.Client()
		if st.Up() != tc.up || (cerr == nil) != tc.up {
			t.Errorf("%s: after Started, Up() = %v and Client() error %v; want up %v", tc.url, st.Up(), cerr, tc.up)
		}
		st.Close()
	}
	redistest.WaitDelayedRefreshes(t)
}

// The embedded store answers as a one-node Redis Cluster: the lines that
// report a Redis's topology (up, the slot map) are debug for it, so that a
// newcomer's first lines are not about a cluster they never started. A real
// Redis still reports them at info.
func TestEmbeddedStoreTopologyIsDebug(t *testing.T) {
	r := redistest.Start(t)
	topology := []string{"redis is up", "redis node is up", "redis cluster slot map changed"}
	for _, tc := range []struct {
		url  string
		want zapcore.Level
	}{{"", zapcore.DebugLevel}, {r.URL(), zapcore.InfoLevel}} {
		core, logs := observer.New(zapcore.DebugLevel)
		st, err := OpenStore(StoreOptions{RedisURL: tc.url, Timeout: time.Second, Logger: zap.New(core)})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, `a "redis is up" log line`, func() bool { return logs.FilterMessage("redis is up").Len() > 0 })
		st.Close()
		for _, e := range logs.All() {
			if slices.Contains(topology, e.Message) && e.Level != tc.want {
				t.Errorf("store %q: %q logged at %v, want %v", tc.url, e.Message, e.Level, tc.want)
			}
		}
		if tc.url == "" && logs.FilterMessage("redis cluster slot map changed").Len() == 0 {
			t.Errorf("embedded store: no slot map line at debug (logs %v)", logs.All())
		}
	}
}

// OnConnect is told of every node once the client is connected, and of a
// node again when a connection to it replaces one that was closed (a
// Redis restart empties its script cache), not of the connections rueidis
// adds as calls need them.
func TestOnConnectTellsOfEveryReconnection(t *testing.T) {
	r := redistest.Start(t)
	p := redistest.StartFaultProxy(t, r.Addr())
	st, err := OpenStore(StoreOptions{RedisURL: p.URL(), ProbeInterval: 20 * time.Millisecond, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	type event struct {
		addr string
		at   time.Time
	}
	told := make(chan event, 16)
	st.OnConnect(func(addr string, node rueidis.Client) {
		if node == nil {
			t.Error("OnConnect got no client for", addr)
		}
		told <- event{addr, time.Now()}
	})
	next := func(what string) event {
		t.Helper()
		select {
		case ev := <-told:
			if ev.addr != p.Addr() {
				t.Fatalf("OnConnect told of %s, want %s", ev.addr, p.Addr())
			}
			return ev
		case <-time.After(20 * time.Second):
			t.Fatalf("OnConnect was not told of %s", what)
		}
		return event{}
	}
	next("the node once connected")
	accepted := p.Accepted()
	reset := time.Now()
	p.Reset()
	// The probe reconnects.
	for ev := next("the reconnection"); ev.at.Before(reset); ev = next("the reconnection") {
	}
	// The client is told once its dial returns, which can be before the
	// proxy's accepting goroutine has counted the connection.
	for deadline := time.Now().Add(20 * time.Second); p.Accepted() == accepted; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no new connection after the reset")
		}
	}
}
