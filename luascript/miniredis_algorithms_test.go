package luascript_test

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
)

// The embedded store runs every algorithm too: gopher-lua must compile the
// scripts (the peeks without their flags line), serve TIME, and give the
// same answers as Redis for the simple cases.
func TestAlgorithmsOnMiniredis(t *testing.T) {
	_, c := startMiniredis(t)
	prefix := randomPrefix(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, prefix) })
	e := &env{t: t, c: c, prefix: prefix}

	b := e.tbKey("u")
	slow := func(cost int64, id string) luascript.Args {
		a := tb(b, 1, 3, cost, id)
		a.PeriodMS = 3_600_000
		a.DedupeMS = a.RefillMS()
		return a
	}
	if r := e.tbTake(slow(2, "a")); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("token bucket take = %+v, want allowed, 1 left", r)
	}
	if r := e.tbTake(slow(2, "a")); !r.Replay || r.Remaining != 1 {
		t.Fatalf("token bucket replay = %+v", r)
	}
	if r := e.tbTake(slow(2, "b")); r.Allowed || r.RetryAfterMS <= 0 {
		t.Fatalf("token bucket take over the burst = %+v, want denied", r)
	}
	e.tbTakeErr(slow(1, "a"), luascript.ErrConflict)
	if p := e.tbPeek(slow(1, "")); p.Remaining != 1 || p.ResetMS <= 0 {
		t.Fatalf("token bucket peek = %+v, want 1 left", p)
	}

	// Large integers survive gopher-lua's formatting and arithmetic too.
	big := luascript.Args{
		Key: e.tbKey("big"), TokenBucket: luascript.TokenBucket{Rate: 999_999_937, PeriodMS: 1000, Burst: 999_999_937},
		Cost: 999_999_936, DedupeMS: 60_000, MaxRequestIDs: 1, RequestID: "big",
	}
	if r := e.tbTake(big); !r.Allowed || r.Remaining != 1 || r.ResetMS != 1000 {
		t.Fatalf("take from a bucket of a prime rate = %+v, want 1 left, full in 1000 ms", r)
	}
	if r := e.tbTake(big); !r.Replay || r.Remaining != 1 {
		t.Fatalf("its replay = %+v", r)
	}

	k := e.ccKey("u")
	if r := e.acquire(lease(k, 1, minute, "a")); !r.Allowed || r.Used != 1 {
		t.Fatalf("lease = %+v", r)
	}
	if r := e.acquire(lease(k, 1, minute, "b")); r.Allowed || r.RetryAfterMS <= 0 {
		t.Fatalf("lease over the limit = %+v, want denied", r)
	}
	if p := e.leasePeek(k, 1, minute); p.Used != 1 {
		t.Fatalf("lease peek = %+v", p)
	}
	if r := e.release(k, "a"); !r.Released {
		t.Fatalf("release = %+v", r)
	}

	fw := e.key("u")
	e.take(args(fw, 3, 1, ""))
	if r, err := luascript.Peek(t.Context(), c, limits.FixedWindow, luascript.Args{Key: fw, Limit: 3, WindowMS: minute}); err != nil || r.Used != 1 {
		t.Fatalf("fixed window peek = %+v, %v", r, err)
	}
	if _, err := luascript.Peek(t.Context(), c, limits.Concurrency, luascript.Args{Key: fw, Limit: 1, LeaseMS: 1}); !errors.Is(err, luascript.ErrWrongType) {
		t.Fatalf("lease peek on a window = %v, want WRONGTYPE", err)
	}
}

// On Redis the peeks run as written, flags line included, so Redis knows
// they never write (a replica serves them): the script Redis cached is the
// flagged one.
func TestPeeksRunWithNoWritesFlagOnRedis(t *testing.T) {
	e := setup(t)
	e.tbPeek(tb(e.tbKey("u"), 1, 1, 1, ""))
	e.leasePeek(e.ccKey("u"), 1, 1)
	if _, err := luascript.Peek(t.Context(), e.c, limits.FixedWindow, luascript.Args{Key: e.key("u"), Limit: 1, WindowMS: 1}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"token_bucket_peek.lua", "concurrency_peek.lua", "fixed_window_peek.lua"} {
		src := luascript.ScriptText(name)
		if !strings.HasPrefix(src, "#!lua flags=no-writes\n") {
			t.Errorf("%s does not start with the no-writes flags line", name)
		}
		sum := sha1.Sum([]byte(src))
		n, err := e.do("SCRIPT", "EXISTS", hex.EncodeToString(sum[:])).AsIntSlice()
		if err != nil || len(n) != 1 || n[0] != 1 {
			t.Errorf("%s: SCRIPT EXISTS = %v, %v; want the flagged script cached", name, n, err)
		}
	}
}
