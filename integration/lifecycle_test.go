package integration_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// TestSIGTERMDrainsInFlightTake stops a sidecar while a take waits on a
// stalled Redis: the take still gets its real answer, the process exits 0
// and the socket file is gone.
func TestSIGTERMDrainsInFlightTake(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL(), "--redis-timeout", "20s", "--shutdown-timeout", "30s")
	c := sc.dial(t)

	// CLIENT PAUSE WRITE holds scripts until UNPAUSE, so the take is in
	// flight until the test lets it go; the steps in between take
	// milliseconds, far inside the sidecar's Redis deadline.
	redisOK(t, r, "CLIENT", "PAUSE", "60000", "WRITE")
	t.Cleanup(func() { _ = r.Do(t, "CLIENT", "UNPAUSE").Error() })
	c.send(mustJSON(t, takeReq("inflight", 5, 60000, "id", "drain", "request_id", "t-1")))
	waitBlockedScript(t, r)

	sc.signal(t, syscall.SIGTERM)
	sc.waitLog(t, "info", "shutting down")
	eventually(t, "the socket file to be removed when draining starts", func() bool {
		return !fileExists(sc.socket)
	})
	redisOK(t, r, "CLIENT", "UNPAUSE")

	rep := c.read()
	if rep.fields["id"] != "drain" {
		t.Fatalf("got %s, want the reply to id drain", rep)
	}
	wantTake(t, rep, true, false, 5, 1)
	if code := sc.wait(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0\n%s", code, sc.out.String())
	}
	if fileExists(sc.socket) {
		t.Fatalf("socket %s still exists after exit", sc.socket)
	}
	sc.waitLog(t, "info", "quotad stopped")
	if got := redisString(t, r, "HGET", luascript.FixedWindowKey(sc.prefix, "", "inflight"), "used"); got != "1" {
		t.Fatalf("used = %q in Redis, want 1: the drained take was applied", got)
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestShutdownTimeoutAnswersShuttingDown: when Redis stays stalled past
// --shutdown-timeout, the in-flight take is answered SHUTTING_DOWN and the
// process exits 0 without waiting for Redis.
func TestShutdownTimeoutAnswersShuttingDown(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL(), "--redis-timeout", "60s", "--shutdown-timeout", "300ms")
	c := sc.dial(t)

	// The pause outlasts stopTimeout, so a sidecar that waited for Redis
	// before exiting would fail sc.wait below.
	redisOK(t, r, "CLIENT", "PAUSE", "120000", "WRITE")
	t.Cleanup(func() { _ = r.Do(t, "CLIENT", "UNPAUSE").Error() })
	c.send(mustJSON(t, takeReq("cut-off", 5, 60000, "id", "late", "request_id", "t-1")))
	waitBlockedScript(t, r)

	sc.signal(t, syscall.SIGTERM)
	rep, err := c.readErr()
	if err != nil {
		t.Fatalf("the in-flight take got no reply: %v", err)
	}
	if rep.fields["id"] != "late" {
		t.Fatalf("got %s, want the reply to id late", rep)
	}
	wantError(t, rep, "SHUTTING_DOWN")
	if code := sc.wait(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0\n%s", code, sc.out.String())
	}
	if fileExists(sc.socket) {
		t.Fatalf("socket %s still exists after exit", sc.socket)
	}
	sc.waitLog(t, "warn", "shutdown timed out")
	redisOK(t, r, "CLIENT", "UNPAUSE")
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestSocketPathHygiene: a leftover socket nobody listens on is replaced, a
// regular file is never deleted, and a live sidecar's socket is never taken.
func TestSocketPathHygiene(t *testing.T) {
	t.Parallel()

	t.Run("stale socket is replaced", func(t *testing.T) {
		path := socketPath(t)
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
		if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeSocket == 0 {
			t.Fatalf("want a leftover socket file at %s: %v", path, err)
		}
		sc := launchSidecar(t, path, "")
		sc.waitReady(t)
	})

	t.Run("regular file is refused", func(t *testing.T) {
		path := socketPath(t)
		if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, stderr, code := cli(t, "serve", "--socket", path, "--log-format", "json")
		if code == 0 || !strings.Contains(stderr, "not a socket") {
			t.Fatalf("serve on a regular file: exit %d, stderr %q; want non-zero and a message saying it is not a socket", code, stderr)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
			t.Fatalf("the regular file was changed: %q, %v", b, err)
		}
	})

	t.Run("live socket is refused", func(t *testing.T) {
		first := startSidecar(t, "")
		_, stderr, code := cli(t, "serve", "--socket", first.socket, "--log-format", "json")
		if code == 0 || !strings.Contains(stderr, "another process") {
			t.Fatalf("second serve on a live socket: exit %d, stderr %q; want non-zero and a message naming the other process", code, stderr)
		}
		if err := first.pingReady(); err != nil {
			t.Fatalf("the first sidecar stopped answering: %v", err)
		}
	})

	t.Run("missing directory is refused", func(t *testing.T) {
		path := filepath.Join(filepath.Dir(socketPath(t)), "missing", "q.sock")
		_, stderr, code := cli(t, "serve", "--socket", path, "--log-format", "json")
		if code == 0 || !strings.Contains(stderr, "--socket") {
			t.Fatalf("serve in a missing directory: exit %d, stderr %q; want non-zero and a message naming --socket", code, stderr)
		}
	})
}

// TestEmbeddedStore: without --redis-url the sidecar still decides, says so
// on ping, and warns loudly that quotas are local to the process.
func TestEmbeddedStore(t *testing.T) {
	t.Parallel()
	sc := startSidecar(t, "")
	c := sc.dial(t)

	p := c.do(`{"op":"ping"}`)
	if !p.ok() || p.str(t, "store") != "embedded" || !p.flag(t, "redis_ok") {
		t.Fatalf("ping: got %s, want store embedded and redis_ok", p)
	}
	wantTake(t, c.call(takeReq("solo", 3, 60000, "cost", 2, "request_id", "e-1")), true, false, 3, 2)
	rep := c.call(takeReq("solo", 3, 60000, "cost", 2, "request_id", "e-1"))
	wantTake(t, rep, true, true, 3, 2)
	wantResetWithin(t, rep, 60000)
	wantTake(t, c.call(takeReq("solo", 3, 60000, "cost", 2)), false, false, 3, 2)
	wantError(t, c.call(takeReq("solo", 3, 60000, "cost", 1, "request_id", "e-1")), "CONFLICT")
	wantPeek(t, c.call(peekReq("solo", 3, 60000)), 3, 2)
	sc.waitLog(t, "warn", "NO REDIS CONFIGURED")
}

// TestSecondSignalExitsNow: an operator who signals twice gets an exit at
// once (status 1), even while a take is still waiting for Redis.
func TestSecondSignalExitsNow(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL(), "--redis-timeout", "60s", "--shutdown-timeout", "60s")
	c := sc.dial(t)

	// The pause outlasts stopTimeout, so only the second signal can end the
	// drain in time for sc.wait below.
	redisOK(t, r, "CLIENT", "PAUSE", "120000", "WRITE")
	t.Cleanup(func() { _ = r.Do(t, "CLIENT", "UNPAUSE").Error() })
	c.send(mustJSON(t, takeReq("stuck", 5, 60000, "request_id", "t-1")))
	waitBlockedScript(t, r)

	sc.signal(t, syscall.SIGTERM)
	sc.waitLog(t, "info", "shutting down")
	sc.signal(t, syscall.SIGTERM)
	sc.wantStatus = 1
	if code := sc.wait(t); code != 1 {
		t.Fatalf("exit status %d after a second SIGTERM, want 1\n%s", code, sc.out.String())
	}
	sc.waitLog(t, "warn", "second signal: exiting now")
	redisOK(t, r, "CLIENT", "UNPAUSE")
}
