package integration_test

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// TestConcurrentTakesAcceptExactlyTheLimit races 20 clients, each on its own
// connection, for a limit of 5: exactly 5 win, each sees a distinct count,
// and Redis holds 5 used.
func TestConcurrentTakesAcceptExactlyTheLimit(t *testing.T) {
	t.Parallel()
	const clients, limit = 20, 5
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())

	conns := make([]*lineConn, clients)
	for i := range conns {
		conns[i] = sc.dial(t)
	}
	line := mustJSON(t, takeReq("crowd", limit, 60000))
	replies := make([]reply, clients)
	errs := make([]error, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = c.roundTrip(line)
		})
	}
	close(start)
	wg.Wait()

	var usedWhenAllowed []int64
	for i, rep := range replies {
		if errs[i] != nil {
			t.Fatalf("client %d: %v", i, errs[i])
		}
		if !rep.ok() {
			t.Fatalf("client %d: got %s, want a decision", i, rep)
		}
		if rep.flag(t, "allowed") {
			usedWhenAllowed = append(usedWhenAllowed, rep.num(t, "used"))
		} else {
			wantTake(t, rep, false, false, limit, limit)
		}
	}
	slices.Sort(usedWhenAllowed)
	if want := []int64{1, 2, 3, 4, 5}; !slices.Equal(usedWhenAllowed, want) {
		t.Fatalf("allowed takes saw used %v, want exactly %v", usedWhenAllowed, want)
	}
	key := luascript.FixedWindowKey(sc.prefix, "", "crowd")
	if got := redisString(t, r, "HGET", key, "used"); got != "5" {
		t.Fatalf("HGET %s used = %q, want 5", key, got)
	}
	wantPeek(t, conns[0].call(peekReq("crowd", limit, 60000)), limit, limit)
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestRetryKeepsWindowEndAndWindowReopens checks that a replay never moves
// the end of a window, and that once a window ends its request ids and its
// count are gone.
func TestRetryKeepsWindowEndAndWindowReopens(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())

	t.Run("replay does not extend the window", func(t *testing.T) {
		c := sc.dial(t)
		key := luascript.FixedWindowKey(sc.prefix, "", "retry")
		first := c.call(takeReq("retry", 5, 60000, "cost", 2, "request_id", "r-1"))
		wantTake(t, first, true, false, 5, 2)
		// Let the TTL run down a little, so that a replay that reset it to
		// the full window would show as a larger PTTL.
		var before int64
		eventually(t, "the window's PTTL to fall below 59900 ms", func() bool {
			before = redisInt(t, r, "PTTL", key)
			return before > 0 && before < 59900
		})
		again := c.call(takeReq("retry", 5, 60000, "cost", 2, "request_id", "r-1"))
		wantTake(t, again, true, true, 5, 2)
		after := redisInt(t, r, "PTTL", key)
		if after <= 0 || after > before {
			t.Fatalf("PTTL %d after the replay, %d before: a replay must not extend the window", after, before)
		}
		if again.num(t, "reset_ms") > before {
			t.Fatalf("replay reset_ms %d, PTTL before it %d: the replay reports a later end", again.num(t, "reset_ms"), before)
		}
	})

	t.Run("window reopens after it ends", func(t *testing.T) {
		c := sc.dial(t)
		const windowMS = 400
		key := luascript.FixedWindowKey(sc.prefix, "", "short")
		first := c.call(takeReq("short", 5, windowMS, "cost", 2, "request_id", "r-1"))
		wantTake(t, first, true, false, 5, 2)
		wantResetWithin(t, first, windowMS)
		eventually(t, "the window to expire", func() bool {
			return redisInt(t, r, "PTTL", key) == -2
		})
		// Same request_id, another cost: in the old window this would be
		// CONFLICT; in the new one it is a new take and the count restarts.
		next := c.call(takeReq("short", 5, windowMS, "cost", 3, "request_id", "r-1"))
		wantTake(t, next, true, false, 5, 3)
		wantResetWithin(t, next, windowMS)
	})

	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestInvalidRequestsCreateNoKey sends requests that break each validation
// rule and checks that every one is INVALID and that Redis holds no key
// afterwards: validation precedes every write.
func TestInvalidRequestsCreateNoKey(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	c := sc.dial(t)

	inline := func(subject string, rest string) string {
		return `{"op":"take","subject":"` + subject + `"` + rest + `}`
	}
	cases := []struct{ name, line string }{
		{"negative cost", inline("s1", `,"limit":5,"window_ms":60000,"cost":-1`)},
		{"zero cost", inline("s2", `,"limit":5,"window_ms":60000,"cost":0`)},
		{"fractional cost", inline("s3", `,"limit":5,"window_ms":60000,"cost":1.5`)},
		{"cost 2.0", inline("s4", `,"limit":5,"window_ms":60000,"cost":2.0`)},
		{"cost above limit", inline("s5", `,"limit":5,"window_ms":60000,"cost":6`)},
		{"zero limit", inline("s6", `,"limit":0,"window_ms":60000`)},
		{"negative limit", inline("s7", `,"limit":-5,"window_ms":60000`)},
		{"fractional limit", inline("s8", `,"limit":1.5,"window_ms":60000`)},
		{"limit as a string", inline("s9", `,"limit":"5","window_ms":60000`)},
		{"limit with exponent", inline("s10", `,"limit":1e3,"window_ms":60000`)},
		{"limit true", inline("s11", `,"limit":true,"window_ms":60000`)},
		{"limit above maximum", inline("s12", `,"limit":1000000001,"window_ms":60000`)},
		{"huge limit", inline("s13", `,"limit":123456789012345678901234567890,"window_ms":60000`)},
		{"huge negative limit", inline("s14", `,"limit":-123456789012345678901234567890,"window_ms":60000`)},
		{"huge cost", inline("s15", `,"limit":5,"window_ms":60000,"cost":18446744073709551617`)},
		{"window above 31 days", inline("s16", `,"limit":5,"window_ms":2678400001`)},
		{"zero window", inline("s17", `,"limit":5,"window_ms":0`)},
		{"window with exponent", inline("s18", `,"limit":5,"window_ms":6e4`)},
		{"missing limit", inline("s19", `,"window_ms":60000`)},
		{"missing window", inline("s20", `,"limit":5`)},
		{"policy and limit", inline("s21", `,"policy":"api","limit":5,"window_ms":60000`)},
		{"missing subject", `{"op":"take","limit":5,"window_ms":60000}`},
		{"empty subject", inline("", `,"limit":5,"window_ms":60000`)},
		{"null subject", `{"op":"take","subject":null,"limit":5,"window_ms":60000}`},
		{"subject too long", inline(strings.Repeat("x", 257), `,"limit":5,"window_ms":60000`)},
		{"subject with a control character", inline(`s\u0007`, `,"limit":5,"window_ms":60000`)},
		{"request_id too long", inline("s22", `,"limit":5,"window_ms":60000,"request_id":"`+strings.Repeat("r", 65)+`"`)},
		{"request_id with a space", inline("s23", `,"limit":5,"window_ms":60000,"request_id":"order 1"`)},
		{"request_id with a slash", inline("s24", `,"limit":5,"window_ms":60000,"request_id":"order/1"`)},
		{"request_id with a colon", inline("s25", `,"limit":5,"window_ms":60000,"request_id":"order:1"`)},
		{"request_id not ASCII", inline("s26", `,"limit":5,"window_ms":60000,"request_id":"ørder"`)},
		{"empty request_id", inline("s27", `,"limit":5,"window_ms":60000,"request_id":""`)},
		{"request_id a number", inline("s28", `,"limit":5,"window_ms":60000,"request_id":7`)},
		{"zero timeout_ms", inline("s29", `,"limit":5,"window_ms":60000,"timeout_ms":0`)},
		{"duplicate cost", inline("s30", `,"limit":5,"window_ms":60000,"cost":1,"cost":1`)},
		{"upper-case op key", `{"OP":"take","subject":"s31","limit":5,"window_ms":60000}`},
		{"unknown op", `{"op":"give","subject":"s32","limit":5,"window_ms":60000}`},
		{"trailing data", inline("s33", `,"limit":5,"window_ms":60000`) + ` {}`},
		{"peek with zero limit", `{"op":"peek","subject":"s34","limit":0,"window_ms":60000}`},
	}
	for _, tc := range cases {
		rep := c.do(tc.line)
		if rep.code() != "INVALID" {
			t.Errorf("%s: %s\ngot %s, want INVALID", tc.name, tc.line, rep)
		}
	}
	if keys := scanKeys(t, r, sc.prefix); len(keys) != 0 {
		t.Fatalf("invalid requests left keys in Redis: %q", keys)
	}

	// The same scan does see the key of a valid take.
	wantTake(t, c.call(takeReq("valid", 5, 60000)), true, false, 5, 1)
	if keys, want := scanKeys(t, r, sc.prefix), luascript.FixedWindowKey(sc.prefix, "", "valid"); len(keys) != 1 || keys[0] != want {
		t.Fatalf("after one valid take, keys %q; want only %q", keys, want)
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestWrongTypeLeavesValueUntouched puts data quotad did not write at a
// subject's key: take and peek answer WRONGTYPE and the data stays as it was.
func TestWrongTypeLeavesValueUntouched(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	c := sc.dial(t)

	str := luascript.FixedWindowKey(sc.prefix, "", "a-string")
	redisOK(t, r, "SET", str, "not a quota", "PX", "600000")
	wantError(t, c.call(takeReq("a-string", 5, 60000, "request_id", "r-1")), "WRONGTYPE")
	wantError(t, c.call(peekReq("a-string", 5, 60000)), "WRONGTYPE")
	if got := redisString(t, r, "GET", str); got != "not a quota" {
		t.Fatalf("GET %s = %q after take, want the value unchanged", str, got)
	}

	hash := luascript.FixedWindowKey(sc.prefix, "", "a-hash")
	redisOK(t, r, "HSET", hash, "owner", "someone else")
	redisOK(t, r, "PEXPIRE", hash, "600000")
	wantError(t, c.call(takeReq("a-hash", 5, 60000)), "WRONGTYPE")
	fields, err := r.Do(t, "HGETALL", hash).AsStrMap()
	if err != nil || len(fields) != 1 || fields["owner"] != "someone else" {
		t.Fatalf("HGETALL %s = %v (%v) after take, want only owner=someone else", hash, fields, err)
	}

	list := luascript.FixedWindowKey(sc.prefix, "", "a-list")
	redisOK(t, r, "RPUSH", list, "x")
	redisOK(t, r, "PEXPIRE", list, "600000")
	wantError(t, c.call(takeReq("a-list", 5, 60000)), "WRONGTYPE")
	if got := redisInt(t, r, "LLEN", list); got != 1 {
		t.Fatalf("LLEN %s = %d after take, want 1", list, got)
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestKeyWithoutTTLIsHealed: a window that lost its TTL (an operator's
// PERSIST, a restore) would hold its quota forever; the next take gives it
// one back and the sidecar says so in its log.
func TestKeyWithoutTTLIsHealed(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	c := sc.dial(t)
	key := luascript.FixedWindowKey(sc.prefix, "", "immortal")

	wantTake(t, c.call(takeReq("immortal", 5, 60000)), true, false, 5, 1)
	if n := redisInt(t, r, "PERSIST", key); n != 1 {
		t.Fatalf("PERSIST %s = %d, want 1", key, n)
	}
	if pttl := redisInt(t, r, "PTTL", key); pttl != -1 {
		t.Fatalf("PTTL after PERSIST = %d, want -1", pttl)
	}

	rep := c.call(takeReq("immortal", 5, 60000))
	wantTake(t, rep, true, false, 5, 2)
	wantResetWithin(t, rep, 60000)
	if pttl := redisInt(t, r, "PTTL", key); pttl < 1 || pttl > 60000 {
		t.Fatalf("PTTL after the healing take = %d, want 1..60000", pttl)
	}
	line := sc.waitLog(t, "warn", "restored the TTL of a quota key that had none")
	if line.str("key") != key {
		t.Fatalf("heal log line names key %q, want %q: %v", line.str("key"), key, line)
	}

	// A take that is refused still repairs the window, and the repair is
	// still logged: here inline limits that disagree with the window.
	key2 := luascript.FixedWindowKey(sc.prefix, "", "immortal-2")
	wantTake(t, c.call(takeReq("immortal-2", 5, 60000)), true, false, 5, 1)
	redisInt(t, r, "PERSIST", key2)
	if rep := c.call(takeReq("immortal-2", 6, 60000)); rep.code() != "POLICY" {
		t.Fatalf("take with other limits = %v, want POLICY", rep)
	}
	if pttl := redisInt(t, r, "PTTL", key2); pttl < 1 || pttl > 60000 {
		t.Fatalf("PTTL after the refused take = %d, want 1..60000", pttl)
	}
	eventually(t, "a heal log line for "+key2, func() bool {
		for _, l := range sc.logLines() {
			if l.str("msg") == "restored the TTL of a quota key that had none" && l.str("key") == key2 {
				return true
			}
		}
		return false
	})
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestAppendOnlyRestartKeepsWindow restarts a persistent Redis under a
// running sidecar: the window keeps its count, its request ids and its end,
// and the sidecar reconnects by itself.
func TestAppendOnlyRestartKeepsWindow(t *testing.T) {
	t.Parallel()
	const windowMS = 60000
	r := redistest.Start(t, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "always"))
	sc := startSidecar(t, r.URL())
	c := sc.dial(t)
	key := luascript.FixedWindowKey(sc.prefix, "", "durable")
	take := takeReq("durable", 5, windowMS, "cost", 3, "request_id", "before-restart")

	wantTake(t, c.call(take), true, false, 5, 3)
	r.Restart(t)

	// Retrying with the same request_id is what a client does after
	// UNAVAILABLE; the retries are safe because the take is idempotent.
	var rep reply
	var refused []string
	eventually(t, "a take to succeed after the restart", func() bool {
		rep = c.call(take)
		if rep.ok() {
			return true
		}
		if rep.code() != "UNAVAILABLE" {
			t.Fatalf("while Redis restarts: got %s, want UNAVAILABLE or an answer", rep)
		}
		refused = append(refused, rep.raw)
		return false
	})
	if len(refused) > 0 {
		t.Logf("refused while reconnecting: %s", strings.Join(refused, "\n"))
	}
	wantTake(t, rep, true, true, 5, 3)
	wantResetWithin(t, rep, windowMS)

	peek := c.call(peekReq("durable", 5, windowMS))
	wantPeek(t, peek, 5, 3)
	wantResetWithin(t, peek, windowMS)
	if pttl := redisInt(t, r, "PTTL", key); pttl < 1 || pttl > windowMS {
		t.Fatalf("PTTL after restart = %d, want 1..%d", pttl, windowMS)
	}
	eventually(t, "ping to report redis_ok again", func() bool {
		p := c.do(`{"op":"ping"}`)
		return p.ok() && p.flag(t, "redis_ok")
	})
	assertKeysHaveTTL(t, r, sc.prefix)
}
