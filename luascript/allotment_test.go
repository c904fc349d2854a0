package luascript_test

import (
	"testing"
	"time"

	"quotad/limits"
	"quotad/luascript"
)

// fwReserve is a reservation of holder h on a window of limit per minute.
func fwReserve(key string, limit, cost, want, sharePPM, seq int64) luascript.Args {
	return luascript.Args{Key: key, Limit: limit, WindowMS: minute, Cost: cost, Want: want, SharePPM: sharePPM, RequestID: "h", Seq: seq}
}

func (e *env) reserve(algorithm string, a luascript.Args) luascript.Reservation {
	e.t.Helper()
	r, err := luascript.Reserve(e.t.Context(), e.c, algorithm, a)
	if err != nil {
		e.t.Fatalf("reserve %+v: %v", a, err)
	}
	return r
}

func (e *env) giveBack(algorithm string, a luascript.Args) int64 {
	e.t.Helper()
	n, err := luascript.Return(e.t.Context(), e.c, algorithm, a)
	if err != nil {
		e.t.Fatalf("return %+v: %v", a, err)
	}
	return n
}

// A reservation takes what the sidecar wants, at most max_share of what
// is left and at least the take's cost, so that near the limit it
// shrinks to the take itself; a cost that does not fit is a denial that
// writes nothing.
func TestReservationSize(t *testing.T) {
	e := setup(t)
	k := e.key("size")
	for _, step := range []struct {
		cost, want, share   int64
		granted, used, left int64
		denied              bool
	}{
		{1, 50, 100_000, 50, 50, 950, false},     // a new window: 10% of 1000 is 100, wants 50
		{1, 500, 100_000, 95, 145, 855, false},   // 10% of 950
		{1, 900, 1_000_000, 855, 1000, 0, false}, // all of what is left
		{1, 1, 1_000_000, 0, 1000, 0, true},      // nothing left
	} {
		r := e.reserve(limits.FixedWindow, fwReserve(k, 1000, step.cost, step.want, step.share, 1))
		if r.Granted != step.granted || r.Used != step.used || r.Remaining != step.left || (r.RetryAfterMS > 0) != step.denied {
			t.Fatalf("step %+v: %+v", step, r)
		}
		if !step.denied && (r.ValidMS <= 0 || r.ValidMS > minute || r.ResetMS != r.ValidMS) {
			t.Fatalf("step %+v: valid_ms %d, reset_ms %d", step, r.ValidMS, r.ResetMS)
		}
	}
	if h := e.hash(k); h["a:h"] != "1:855" || h["used"] != "1000" {
		t.Fatalf("hash %v: want the holder's record of its last 855 units (it kept none)", h)
	}

	// Near the limit the share of what is left is below the cost: the
	// reservation is the take itself.
	k2 := e.key("near")
	e.take(luascript.Args{Key: k2, Limit: 100, WindowMS: minute, Cost: 97, MaxRequestIDs: 10})
	if r := e.reserve(limits.FixedWindow, fwReserve(k2, 100, 2, 50, 50_000, 1)); r.Granted != 2 || r.Remaining != 1 {
		t.Fatalf("near the limit: %+v, want 2 granted", r)
	}
	if r := e.reserve(limits.FixedWindow, fwReserve(k2, 100, 2, 50, 50_000, 2)); r.Granted != 0 || r.RetryAfterMS <= 0 {
		t.Fatalf("a cost that does not fit: %+v, want a denial", r)
	}
}

// A return gives the unused units back to the window they were taken in,
// once, even when it is sent again; a return naming an earlier
// reservation of the holder, or a window that ended, changes nothing.
func TestReturnIsAppliedOnce(t *testing.T) {
	e := setup(t)
	k := e.key("ret")
	if r := e.reserve(limits.FixedWindow, fwReserve(k, 100, 1, 10, 1_000_000, 1)); r.Granted != 10 {
		t.Fatalf("reserve: %+v", r)
	}
	// A second reservation of the same holder adds to its record.
	if r := e.reserve(limits.FixedWindow, fwReserve(k, 100, 1, 5, 1_000_000, 2)); r.Granted != 5 || r.Used != 15 {
		t.Fatalf("reserve again: %+v", r)
	}
	ttl := e.pttl(k)
	ret := luascript.Args{Key: k, Cost: 4, RequestID: "h", Seq: 1}
	if n := e.giveBack(limits.FixedWindow, ret); n != 0 {
		t.Fatalf("a return of an earlier reservation gave back %d", n)
	}
	ret.Seq = 2
	for i := range 3 {
		n := e.giveBack(limits.FixedWindow, ret)
		if want := map[bool]int64{true: 4, false: 0}[i == 0]; n != want {
			t.Fatalf("return #%d gave back %d, want %d", i+1, n, want)
		}
		if h := e.hash(k); h["used"] != "11" || h["a:h"] != "" {
			t.Fatalf("after return #%d: %v, want used 11 and no record", i+1, h)
		}
	}
	if after := e.pttl(k); after > ttl || after <= 0 {
		t.Fatalf("PTTL %d before the returns, %d after: a return never moves a window's end", ttl, after)
	}
	// More than reserved is refused, and writes nothing.
	e.reserve(limits.FixedWindow, fwReserve(k, 100, 1, 3, 1_000_000, 3))
	if _, err := luascript.Return(t.Context(), e.c, limits.FixedWindow, luascript.Args{Key: k, Cost: 4, RequestID: "h", Seq: 3}); err == nil {
		t.Fatal("a return of more than was reserved was applied")
	}

	// A window that ended needs no return, and gets none: the next window
	// is never credited.
	short := luascript.Args{Key: e.key("short"), Limit: 10, WindowMS: 50, Cost: 1, Want: 5, SharePPM: 1_000_000, RequestID: "h", Seq: 1}
	e.reserve(limits.FixedWindow, short)
	e.waitGone(short.Key)
	e.take(luascript.Args{Key: short.Key, Limit: 10, WindowMS: minute, Cost: 3, MaxRequestIDs: 10})
	if n := e.giveBack(limits.FixedWindow, luascript.Args{Key: short.Key, Cost: 5, RequestID: "h", Seq: 1}); n != 0 {
		t.Fatalf("a return after its window ended gave back %d to the next", n)
	}
	if h := e.hash(short.Key); h["used"] != "3" {
		t.Fatalf("the next window: %v, want used 3", h)
	}
}

// A calendar reservation counts in the period holding Redis's clock and
// says which, so that its return goes to that period's key.
func TestCalendarReservation(t *testing.T) {
	e := setup(t)
	cw := limits.CalendarWindow{Limit: 100, Period: limits.PeriodHour, TimeZone: "UTC"}
	key := luascript.CalendarKey(e.prefix, "cal", "s")
	a := luascript.Args{Key: key, Limit: 100, Spec: cw.Spec(), Periods: luascript.CalendarAround(cw, 0, time.Now()),
		Cost: 1, Want: 20, SharePPM: 1_000_000, RequestID: "h", Seq: 1}
	r := e.reserve(limits.Calendar, a)
	if r.Granted != 20 || r.Period < 1 || r.ValidMS <= 0 || r.ValidMS > 3_600_000 {
		t.Fatalf("reserve: %+v", r)
	}
	pk := luascript.CalendarPeriodKey(key, a.Periods.Starts[r.Period-1])
	if h := e.hash(pk); h["used"] != "20" || h["a:h"] != "1:20" {
		t.Fatalf("period %s: %v", pk, h)
	}
	if n := e.giveBack(limits.Calendar, luascript.Args{Key: pk, Cost: 15, RequestID: "h", Seq: 1}); n != 15 {
		t.Fatalf("return gave back %d", n)
	}
	if h := e.hash(pk); h["used"] != "5" {
		t.Fatalf("period after the return: %v", h)
	}
}

// A bucket's reservation is a take of its tokens now; a return puts them
// back, once, and never past a full bucket.
func TestTokenBucketReservation(t *testing.T) {
	e := setup(t)
	b := slowBucket(e.tbKey("res"), 10, 1, "")
	res := func(cost, want, share, seq int64) luascript.Args {
		a := b
		a.Cost, a.Want, a.SharePPM, a.RequestID, a.Seq = cost, want, share, "h", seq
		return a
	}
	ret := func(cost, seq int64) luascript.Args {
		return luascript.Args{Key: b.Key, TokenBucket: b.TokenBucket, Cost: cost, RequestID: "h", Seq: seq}
	}
	if r := e.reserve(limits.TokenBucket, res(1, 4, 1_000_000, 1)); r.Granted != 4 || r.Remaining != 6 || r.ValidMS <= 0 {
		t.Fatalf("reserve: %+v", r)
	}
	for i, want := range []int64{3, 0, 0} {
		if n := e.giveBack(limits.TokenBucket, ret(3, 1)); n != want {
			t.Fatalf("return #%d gave back %d, want %d", i+1, n, want)
		}
	}
	if r, err := luascript.Peek(t.Context(), e.c, limits.TokenBucket, luascript.Args{Key: b.Key, TokenBucket: b.TokenBucket}); err != nil || r.Remaining != 9 {
		t.Fatalf("peek after the return: %+v, %v; want 9 tokens", r, err)
	}
	// Half of the 9 left, rounded down.
	if r := e.reserve(limits.TokenBucket, res(1, 10, 500_000, 2)); r.Granted != 4 || r.Remaining != 5 {
		t.Fatalf("reserve half: %+v", r)
	}
	if r := e.reserve(limits.TokenBucket, res(6, 6, 1_000_000, 3)); r.Granted != 0 || r.RetryAfterMS <= 0 {
		t.Fatalf("a cost beyond the tokens left: %+v, want a denial", r)
	}
	// Everything back, and more than the bucket holds is never kept: a
	// full bucket stays full.
	e.giveBack(limits.TokenBucket, ret(4, 2))
	if r, _ := luascript.Peek(t.Context(), e.c, limits.TokenBucket, luascript.Args{Key: b.Key, TokenBucket: b.TokenBucket}); r.Remaining != 9 {
		t.Fatalf("peek: %+v, want 9", r)
	}
}

// Under refill, reservations and returns in any order never let more
// than burst + rate * elapsed / period tokens out of a bucket that started
// full: elapsed is measured around every call, so it is at least Redis's.
func TestTokenBucketReservationsNeverOver(t *testing.T) {
	e := setup(t)
	tb := luascript.TokenBucket{Rate: 100, PeriodMS: 1000, Burst: 10}
	key := e.tbKey("never-over")
	start := time.Now()
	var out int64
	for seq := int64(1); time.Since(start) < 300*time.Millisecond; seq++ {
		r := e.reserve(limits.TokenBucket, luascript.Args{Key: key, TokenBucket: tb, Cost: 1, Want: 7, SharePPM: 800_000,
			DedupeMS: tb.RefillMS(), RequestID: "h", Seq: seq})
		out += r.Granted
		if r.Granted > 1 && seq%3 == 0 {
			back := r.Granted / 2
			out -= e.giveBack(limits.TokenBucket, luascript.Args{Key: key, TokenBucket: tb, Cost: back, RequestID: "h", Seq: seq})
		}
		if limit := tb.Burst + tb.Rate*time.Since(start).Milliseconds()/tb.PeriodMS; out > limit {
			t.Fatalf("%d tokens out after %v, more than %d", out, time.Since(start), limit)
		}
	}
}

// A sliding window's reservation counts in the current period; its
// return lowers that period's count, once.
func TestSlidingWindowReservation(t *testing.T) {
	e := setup(t)
	key := luascript.SlidingWindowKey(e.prefix, "pol", "res")
	a := luascript.Args{Key: key, Limit: 10, WindowMS: limits.MaxWindowMS, Cost: 1, Want: 5, SharePPM: 1_000_000, RequestID: "h", Seq: 1}
	if r := e.reserve(limits.SlidingWindow, a); r.Granted != 5 || r.Used != 5 || r.ValidMS <= 0 {
		t.Fatalf("reserve: %+v", r)
	}
	if _, err := luascript.Take(t.Context(), e.c, limits.SlidingWindow, luascript.Args{Key: key, Limit: 10, WindowMS: limits.MaxWindowMS, Cost: 3, MaxRequestIDs: 10}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{4, 0} {
		if n := e.giveBack(limits.SlidingWindow, luascript.Args{Key: key, Cost: 4, RequestID: "h", Seq: 1}); n != want {
			t.Fatalf("return #%d gave back %d, want %d", i+1, n, want)
		}
	}
	if h := e.hash(key); h["c"] != "4" || h["a:h"] != "" {
		t.Fatalf("after the return: %v, want c 4 and no record", h)
	}
}
