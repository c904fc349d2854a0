package sidecar

import (
	"bufio"
	"crypto/sha1"
	"encoding/hex"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/luascript"
	"quotad/protocol"
)

// debugSleep makes Redis sleep for d with DEBUG SLEEP, which blocks the
// whole server, and returns once Redis is asleep; the returned function
// waits for it to wake.
func debugSleep(t *testing.T, r *redistest.Server, d time.Duration) (wake func()) {
	t.Helper()
	sleeper, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Close() })
	secs := strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
	if _, err := sleeper.Write([]byte("DEBUG SLEEP " + secs + "\r\n")); err != nil {
		t.Fatal(err)
	}
	// Asleep once a PING on another connection goes unanswered; the
	// sleeper's command was written first.
	waitFor(t, "Redis to fall asleep", func() bool {
		nc, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
		_ = nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err = bufio.NewReader(nc).ReadString('\n')
		return err != nil
	})
	return func() {
		t.Helper()
		_ = sleeper.SetReadDeadline(time.Now().Add(waitTimeout))
		line, err := bufio.NewReader(sleeper).ReadString('\n')
		if err != nil || line != "+OK\r\n" {
			t.Fatalf("DEBUG SLEEP: %q, %v", line, err)
		}
	}
}

// scriptBlocked reports whether a client of Redis waits in a script call,
// as CLIENT PAUSE WRITE holds EVAL and EVALSHA.
func scriptBlocked(t *testing.T, r *redistest.Server) bool {
	t.Helper()
	for _, line := range strings.Split(redisString(t, r, "CLIENT", "LIST"), "\n") {
		if strings.Contains(line, " flags=b") && (strings.Contains(line, " cmd=evalsha ") || strings.Contains(line, " cmd=eval ")) {
			return true
		}
	}
	return false
}

// A take that outlives --redis-timeout on a slow Redis is UNAVAILABLE with
// the outcome unknown; Redis may still apply it after the sidecar gave up,
// and a retry with the same request_id after Redis recovers finds it and
// consumes nothing more.
func TestSlowRedisAnswersOutcomeUnknownAndARetryConsumesOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		// slow makes Redis slow; the take is sent after it returns, and
		// resume ends the slowness.
		slow func(t *testing.T, r *redistest.Server) (resume func())
		// afterTimeout checks Redis still holds the take that timed out.
		afterTimeout func(t *testing.T, r *redistest.Server)
	}{
		{
			name: "DEBUG SLEEP",
			slow: func(t *testing.T, r *redistest.Server) func() { return debugSleep(t, r, 6*time.Second) },
		},
		{
			name: "CLIENT PAUSE WRITE",
			slow: func(t *testing.T, r *redistest.Server) func() {
				pauseWrites(t, r)
				return func() { unpause(t, r) }
			},
			afterTimeout: func(t *testing.T, r *redistest.Server) {
				if !scriptBlocked(t, r) {
					t.Fatal("no script call blocked in Redis after the take timed out")
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.Start(t, redistest.WithArgs("--enable-debug-command", "yes"))
			// The deadline is far below the slowness (a 6s sleep, a pause
			// lifted by hand) and far above Redis's latency on a loaded
			// machine, so only the slowness makes a call time out.
			st := openStore(t, r.URL())
			ts := startServer(t, Options{Store: st, AllowInline: true, RedisTimeout: 2 * time.Second})
			c := ts.dial(t)
			waitRedisOK(t, c)
			// Load the script, so that the take reaches Redis as EVALSHA.
			if got := c.call(inlineTake("w", "warm", 5, "")); !got.OK || !got.Allowed {
				t.Fatalf("warm-up take = %+v", got)
			}

			resume := tc.slow(t, r)
			const take = `,"cost":2,"request_id":"slow-1"`
			got := c.call(inlineTake("1", "slow", 5, take))
			checkCode(t, "take on a slow Redis", got, protocol.CodeUnavailable)
			if !strings.Contains(got.Message, "outcome is unknown") {
				t.Fatalf("take on a slow Redis: message %q does not say the outcome is unknown", got.Message)
			}
			if tc.afterTimeout != nil {
				tc.afterTimeout(t, r)
			}
			resume()

			// The outcome is unknown: Redis may have run the take after the
			// sidecar gave up on it (it usually does), or not at all.
			var applied bool
			waitFor(t, "a peek to succeed", func() bool {
				got := c.call(`{"op":"peek","subject":"slow","limit":5,"window_ms":60000}`)
				if !got.OK {
					checkCode(t, "peek while the breaker closes", got, protocol.CodeUnavailable)
					return false
				}
				if got.Used != 0 && got.Used != 2 {
					t.Fatalf("peek after Redis recovered = %+v, want used 2 (the timed-out take ran) or 0 (it did not)", got)
				}
				applied = got.Used == 2
				return true
			})
			t.Logf("Redis ran the timed-out take: %v", applied)
			// Either way, the retry with the same request_id consumes once.
			got = c.call(inlineTake("2", "slow", 5, take))
			if !got.OK || !got.Allowed || got.Used != 2 || applied && !got.Replay {
				t.Fatalf("retry with the same request_id = %+v, want allowed with used 2, and a replay since the first attempt ran (%v)", got, applied)
			}
			if got := c.call(`{"op":"peek","subject":"slow","limit":5,"window_ms":60000}`); !got.OK || got.Used != 2 {
				t.Fatalf("peek after the retry = %+v, want used 2: the cost was consumed once", got)
			}
		})
	}
}

// evalCalls is how many EVAL and EVAL_RO commands Redis has run: each
// sends a script's whole text. Peeks are read-only scripts, sent as
// EVALSHA_RO.
func evalCalls(t *testing.T, r *redistest.Server) int64 {
	t.Helper()
	return r.CommandCalls(t, "eval", "eval_ro")
}

// scriptLoads is how many SCRIPT LOADs Redis has run.
func scriptLoads(t *testing.T, r *redistest.Server) int64 {
	t.Helper()
	return r.CommandCalls(t, "script|load")
}

func TestScriptFlushIsInvisibleToClients(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	if got := c.call(inlineTake("1", "flush", 5, "")); !got.OK || got.Used != 1 {
		t.Fatalf("take = %+v", got)
	}
	if got := c.call(`{"op":"peek","subject":"flush","limit":5,"window_ms":60000}`); !got.OK || got.Used != 1 {
		t.Fatalf("peek = %+v", got)
	}
	evals, loads := evalCalls(t, r), scriptLoads(t, r)
	redisOK(t, r, "SCRIPT", "FLUSH")
	if got := c.call(inlineTake("2", "flush", 5, "")); !got.OK || !got.Allowed || got.Used != 2 {
		t.Fatalf("take after SCRIPT FLUSH = %+v, want allowed with used 2", got)
	}
	if got := c.call(`{"op":"peek","subject":"flush","limit":5,"window_ms":60000}`); !got.OK || got.Used != 2 {
		t.Fatalf("peek after SCRIPT FLUSH = %+v, want used 2", got)
	}
	// Each found its script missing, had it loaded and was sent again:
	// no call carried a script's text.
	if got := scriptLoads(t, r); got != loads+2 {
		t.Fatalf("SCRIPT LOADs went from %d to %d, want one each for the take's and the peek's script", loads, got)
	}
	if got := evalCalls(t, r); got != evals {
		t.Fatalf("EVAL calls went from %d to %d, want none", evals, got)
	}
}

func TestRedisRestartWithEmptyScriptCacheIsInvisibleToClients(t *testing.T) {
	r := redistest.Start(t, redistest.WithArgs("--appendonly", "yes"))
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	if got := c.call(inlineTake("1", "restart", 5, `,"request_id":"before"`)); !got.OK || got.Used != 1 {
		t.Fatalf("take = %+v", got)
	}
	r.Restart(t)
	// The connection to the old process is gone: calls are UNAVAILABLE
	// until the sidecar reconnects, never NOSCRIPT.
	waitFor(t, "a take to succeed after the restart", func() bool {
		got := c.call(inlineTake("2", "restart", 5, `,"request_id":"after"`))
		if !got.OK {
			checkCode(t, "take while the sidecar reconnects", got, protocol.CodeUnavailable)
			if strings.Contains(got.Message, "NOSCRIPT") {
				t.Fatalf("take after the restart = %+v: NOSCRIPT reached the client", got)
			}
			return false
		}
		if !got.Allowed || got.Used != 2 {
			t.Fatalf("take after the restart = %+v, want allowed with used 2 (the window survived in the AOF)", got)
		}
		return true
	})
	// The restarted Redis (whose stats start again) got the scripts back
	// by SCRIPT LOAD, not from calls carrying their text.
	if scriptLoads(t, r) == 0 {
		t.Fatal("the restarted Redis ran no SCRIPT LOAD: the script cache was not empty, so the test proved nothing")
	}
	if n := evalCalls(t, r); n != 0 {
		t.Fatalf("the restarted Redis ran %d EVALs, want none", n)
	}
}

func TestPromotedReplicaWithoutTheScriptIsInvisibleToClients(t *testing.T) {
	master := redistest.Start(t)
	host, port, _ := net.SplitHostPort(master.Addr())
	replica := redistest.Start(t, redistest.WithArgs("--replicaof", host, port))
	waitFor(t, "the replica to sync", func() bool {
		return strings.Contains(redisString(t, replica, "INFO", "replication"), "master_link_status:up")
	})

	onMaster := startServer(t, Options{Store: openStore(t, master.URL()), AllowInline: true}).dial(t)
	waitRedisOK(t, onMaster)
	for i, id := range []string{"m1", "m2"} {
		if got := onMaster.call(inlineTake(id, "promo", 5, `,"request_id":"`+id+`"`)); !got.OK || got.Used != int64(i+1) {
			t.Fatalf("take on the master = %+v", got)
		}
	}
	key := luascript.FixedWindowKey(testPrefix, "", "promo")
	waitFor(t, "the window to reach the replica", func() bool {
		v, err := replica.Do(t, "HGET", key, "used").ToString()
		return err == nil && v == "2"
	})
	src, err := os.ReadFile("../luascript/fixed_window_take.lua")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(src)
	if exists, err := replica.Do(t, "SCRIPT", "EXISTS", hex.EncodeToString(sum[:])).AsIntSlice(); err != nil || len(exists) != 1 || exists[0] != 0 {
		t.Fatalf("SCRIPT EXISTS on the replica = %v, %v: want 0, a replica that never saw the script", exists, err)
	}

	onReplica := startServer(t, Options{Store: openStore(t, replica.URL()), AllowInline: true}).dial(t)
	waitRedisOK(t, onReplica)
	got := onReplica.call(inlineTake("r1", "promo", 5, ""))
	checkCode(t, "take on a read-only replica", got, protocol.CodeUnavailable)
	redisOK(t, replica, "REPLICAOF", "NO", "ONE")
	if got := onReplica.call(inlineTake("r2", "promo", 5, `,"request_id":"m1"`)); !got.OK || !got.Replay || got.Used != 1 {
		t.Fatalf("replay on the promoted replica = %+v, want a replay with used 1", got)
	}
	if got := onReplica.call(inlineTake("r3", "promo", 5, `,"request_id":"r3"`)); !got.OK || !got.Allowed || got.Replay || got.Used != 3 {
		t.Fatalf("take on the promoted replica = %+v, want allowed with used 3", got)
	}
}

// With maxmemory reached and noeviction, a take that would write is
// refused with a clear error and writes nothing; reads, replays and denials
// (which write nothing) still work.
func TestMaxmemoryRefusesWritesAndLeavesTheWindowUnchanged(t *testing.T) {
	r := redistest.Start(t, redistest.WithArgs("--maxmemory-policy", "noeviction"))
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	for i, id := range []string{"a", "b"} {
		if got := c.call(inlineTake(id, "full", 3, `,"request_id":"`+id+`"`)); !got.OK || got.Used != int64(i+1) {
			t.Fatalf("take = %+v", got)
		}
	}
	key := luascript.FixedWindowKey(testPrefix, "", "full")
	hash := func() map[string]string {
		m, err := r.Do(t, "HGETALL", key).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := hash()

	redisOK(t, r, "CONFIG", "SET", "maxmemory", "1")
	for _, tc := range []struct{ what, line string }{
		{"a new request_id", inlineTake("c", "full", 3, `,"request_id":"c"`)},
		{"no request_id", inlineTake("d", "full", 3, "")},
		{"a new subject", inlineTake("e", "empty", 3, "")},
	} {
		got := c.call(tc.line)
		checkCode(t, "take with "+tc.what+" on a full Redis", got, protocol.CodeUnavailable)
		if !strings.Contains(got.Message, "out of memory") || !strings.Contains(got.Message, "nothing was written") {
			t.Fatalf("take with %s on a full Redis: message %q does not say Redis is full and nothing was written", tc.what, got.Message)
		}
	}
	if after := hash(); !maps.Equal(before, after) {
		t.Fatalf("window changed on a full Redis:\nbefore %v\nafter  %v", before, after)
	}
	if n, err := r.Do(t, "EXISTS", luascript.FixedWindowKey(testPrefix, "", "empty")).AsInt64(); err != nil || n != 0 {
		t.Fatalf("EXISTS of the refused new subject = %d, %v: want 0", n, err)
	}
	if got := c.call(`{"op":"peek","subject":"full","limit":3,"window_ms":60000}`); !got.OK || got.Used != 2 {
		t.Fatalf("peek on a full Redis = %+v, want used 2", got)
	}
	if got := c.call(inlineTake("f", "full", 3, `,"request_id":"a"`)); !got.OK || !got.Replay || got.Used != 1 {
		t.Fatalf("replay on a full Redis = %+v, want a replay with used 1", got)
	}
	if got := c.call(inlineTake("g", "full", 3, `,"cost":2`)); !got.OK || got.Allowed || got.Used != 2 {
		t.Fatalf("take beyond the limit on a full Redis = %+v, want a denial with used 2", got)
	}
	// Redis stays up: a refusal is an answer.
	if !st.Up() {
		t.Fatal("a full Redis opened the breaker")
	}
	// A window that lost its TTL gets it back even now: the script's first
	// write restores it, and Redis refuses only a script's first write.
	redisOK(t, r, "PERSIST", key)
	if got := c.call(inlineTake("h", "full", 3, "")); !got.OK && got.Error != protocol.CodeUnavailable {
		t.Fatalf("take on a window without TTL on a full Redis = %+v", got)
	}
	redistest.AssertAllKeysHaveTTL(t, r.Client(t), testPrefix)

	redisOK(t, r, "CONFIG", "SET", "maxmemory", "0")
	if got := c.call(inlineTake("i", "empty", 3, "")); !got.OK || !got.Allowed || got.Used != 1 {
		t.Fatalf("take once Redis has room = %+v, want allowed with used 1", got)
	}
}
