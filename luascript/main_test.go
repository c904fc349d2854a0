package luascript_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/goleak"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// env is one test's redis-server, client and key prefix.
type env struct {
	t      *testing.T
	srv    *redistest.Server
	c      rueidis.Client
	prefix string
}

// setup starts a redis-server for the test. A server per test keeps tests
// independent (a crashed or flushed server cannot leak into the next); the
// random prefix keeps the TTL check at the end to this test's keys.
func setup(t *testing.T) *env {
	t.Helper()
	srv := redistest.Start(t)
	e := &env{t: t, srv: srv, c: srv.Client(t), prefix: randomPrefix(t)}
	if viaBatch {
		e.c = batchingClient{e.c}
	}
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, e.c, e.prefix) })
	return e
}

func randomPrefix(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "test:" + hex.EncodeToString(b[:]) + ":"
}

// key is a fresh window key for a named policy.
func (e *env) key(subject string) string {
	return luascript.FixedWindowKey(e.prefix, "pol", subject)
}

func (e *env) take(a luascript.Args) luascript.Result {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.FixedWindow, a)
	if err != nil {
		e.t.Fatalf("take %+v: %v", a, err)
	}
	return r
}

// takeErr expects the take to fail with want and returns the error.
func (e *env) takeErr(a luascript.Args, want error) error {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.FixedWindow, a)
	if !errors.Is(err, want) {
		e.t.Fatalf("take %+v = %+v, %v; want %v", a, r, err, want)
	}
	return err
}

func (e *env) hash(key string) map[string]string {
	e.t.Helper()
	m, err := e.c.Do(e.t.Context(), e.c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		e.t.Fatalf("HGETALL %s: %v", key, err)
	}
	return m
}

func (e *env) pttl(key string) int64 {
	e.t.Helper()
	n, err := e.c.Do(e.t.Context(), e.c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		e.t.Fatalf("PTTL %s: %v", key, err)
	}
	return n
}

func (e *env) do(args ...string) rueidis.RedisResult {
	e.t.Helper()
	return e.c.Do(e.t.Context(), e.c.B().Arbitrary(args...).Build())
}

func (e *env) mustDo(args ...string) {
	e.t.Helper()
	if err := e.do(args...).Error(); err != nil {
		e.t.Fatalf("%v: %v", args, err)
	}
}

// waitGone polls until key has expired. The deadline is far above any window
// the tests use, so only a window that never ends fails it.
func (e *env) waitGone(key string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	for e.pttl(key) != -2 {
		select {
		case <-ctx.Done():
			e.t.Fatalf("%s still exists: PTTL %d", key, e.pttl(key))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func sameHash(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: hash = %v, want %v", what, got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: hash = %v, want %v", what, got, want)
		}
	}
}

func mustRead(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
