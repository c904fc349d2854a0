package luascript_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
)

const hour = 3_600_000

func fwSettle(key string, limit, cost int64, id string) luascript.Args {
	return luascript.Args{Key: key, Limit: limit, WindowMS: minute, Cost: cost, RequestID: id}
}

func swSettle(key string, limit, cost int64, id string) luascript.Args {
	return luascript.Args{Key: key, Limit: limit, WindowMS: bigW, Cost: cost, RequestID: id}
}

// slowBucket is a bucket of burst tokens refilled one an hour: nothing
// refills during a test.
func slowBucket(key string, burst, cost int64, id string) luascript.Args {
	b := luascript.TokenBucket{Rate: 1, PeriodMS: hour, Burst: burst}
	return luascript.Args{Key: key, TokenBucket: b, Cost: cost, RequestID: id, DedupeMS: b.RefillMS(), MaxRequestIDs: 100}
}

func tbSettle(a luascript.Args, cost int64, id string) luascript.Args {
	return luascript.Args{Key: a.Key, TokenBucket: a.TokenBucket, Cost: cost, RequestID: id, DedupeMS: a.DedupeMS, Strict: a.Strict}
}

// settle runs one settle call and reads it with parse.
func (e *env) settle(build func() (luascript.Call, error), parse func(rueidis.RedisResult) (luascript.Result, error)) (luascript.Result, error) {
	e.t.Helper()
	call, err := build()
	if err != nil {
		return luascript.Result{}, err
	}
	return parse(call.Exec(e.t.Context(), e.c))
}

func (e *env) fwSettle(a luascript.Args) (luascript.Result, error) {
	return e.settle(func() (luascript.Call, error) { return luascript.SettleCall(limits.FixedWindow, a) }, luascript.ParseSettle)
}

func (e *env) swSettle(a luascript.Args) (luascript.Result, error) {
	return e.settle(func() (luascript.Call, error) { return luascript.SettleCall(limits.SlidingWindow, a) }, luascript.ParseSettle)
}

func (e *env) tbSettle(a luascript.Args) (luascript.Result, error) {
	return e.settle(func() (luascript.Call, error) { return luascript.SettleCall(limits.TokenBucket, a) }, luascript.ParseSettle)
}

func (e *env) calSettle(a luascript.Args) (luascript.Result, error) {
	return e.settle(func() (luascript.Call, error) { return luascript.SettleCall(limits.Calendar, a) }, luascript.ParseSettle)
}

// ok fails the test on err and returns r.
func ok(t *testing.T, what string) func(luascript.Result, error) luascript.Result {
	return func(r luascript.Result, err error) luascript.Result {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return r
	}
}

func TestFixedWindowSettle(t *testing.T) {
	e := setup(t)
	k := e.key("u")
	e.take(args(k, 10, 5, "a"))
	ttl := e.pttl(k)

	r := ok(t, "settle lower")(e.fwSettle(fwSettle(k, 10, 3, "a")))
	if !r.Settled || r.Replay || r.Reserved != 5 || r.Used != 3 || r.RetryAfterMS != 0 || r.ResetMS <= 0 || r.ResetMS > minute {
		t.Fatalf("settle of 5 at 3 = %+v, want settled, reserved 5, used 3", r)
	}
	if got := e.hash(k)["s:a"]; got != "3" {
		t.Fatalf("s:a = %q, want 3", got)
	}
	if p := e.pttl(k); p > ttl || p <= 0 {
		t.Fatalf("PTTL %d after the settle, %d before: a settle never moves a window's end", p, ttl)
	}
	r = ok(t, "replay")(e.fwSettle(fwSettle(k, 10, 3, "a")))
	if !r.Settled || !r.Replay || r.Used != 3 || r.Reserved != 5 {
		t.Fatalf("the same settle again = %+v, want a replay at used 3", r)
	}
	before := e.hash(k)
	if _, err := e.fwSettle(fwSettle(k, 10, 4, "a")); !errors.Is(err, luascript.ErrConflict) || !strings.Contains(err.Error(), "settled with cost 3") {
		t.Fatalf("settle at another cost = %v, want CONFLICT naming cost 3", err)
	}
	sameHash(t, "after a CONFLICT", e.hash(k), before)
	// The take itself is still a replay, and consumes nothing.
	if tr := e.take(args(k, 10, 5, "a")); !tr.Replay {
		t.Fatalf("take replay after the settle = %+v", tr)
	}

	// Unknown ids are a no-op answer with the window's state.
	r = ok(t, "unknown id")(e.fwSettle(fwSettle(k, 10, 1, "nope")))
	if r.Settled || r.Replay || r.Reserved != 0 || r.Used != 3 {
		t.Fatalf("settle of an id never accepted = %+v, want not settled, used 3", r)
	}

	// Higher than reserved consumes past the limit; takes then wait for
	// the window's end.
	e.take(args(k, 10, 2, "b"))
	r = ok(t, "settle higher")(e.fwSettle(fwSettle(k, 10, 12, "b")))
	if !r.Settled || r.Used != 15 || r.RetryAfterMS != r.ResetMS || r.RetryAfterMS <= 0 {
		t.Fatalf("settle of 2 at 12 = %+v, want used 15, retry_after = reset", r)
	}
	if tr := e.take(args(k, 10, 1, "")); tr.Allowed || tr.Used != 15 {
		t.Fatalf("take after the overrun = %+v, want denied at 15", tr)
	}

	// A refund gives the whole take back.
	rk := e.key("refund")
	e.take(args(rk, 10, 3, "a"))
	e.take(args(rk, 10, 4, "c"))
	r = ok(t, "refund")(e.fwSettle(fwSettle(rk, 10, 0, "c")))
	if !r.Settled || r.Reserved != 4 || r.Used != 3 {
		t.Fatalf("refund of c = %+v, want used back to 3", r)
	}
	if _, err := e.fwSettle(fwSettle(rk, 10, 4, "c")); !errors.Is(err, luascript.ErrConflict) {
		t.Fatalf("settle after the refund at the reserved cost = %v, want CONFLICT", err)
	}
}

func TestFixedWindowSettleNoWindowIsANoOp(t *testing.T) {
	e := setup(t)
	k := e.key("gone")
	r := ok(t, "no window")(e.fwSettle(fwSettle(k, 10, 1, "a")))
	if r != (luascript.Result{Remaining: 10}) {
		t.Fatalf("settle with no window = %+v, want nothing settled nor used", r)
	}
	if e.pttl(k) != -2 {
		t.Fatal("a settle created a window")
	}
}

// Records and settlements may carry more ':'-separated fields than the
// ones a settle reads; it reads them and leaves them as they are.
func TestSettleKeepsFieldsItDoesNotKnow(t *testing.T) {
	e := setup(t)
	k := e.key("more")
	e.mustDo("HSET", k, "used", "6", "policy", "10:60000", "ids", "2", "r:a", "4:4:x:y", "r:b", "2:6:z", "s:b", "1:w")
	e.mustDo("PEXPIRE", k, "60000")
	r := ok(t, "settle")(e.fwSettle(fwSettle(k, 10, 1, "a")))
	if !r.Settled || r.Reserved != 4 || r.Used != 3 {
		t.Fatalf("settle of a record with more fields = %+v", r)
	}
	if h := e.hash(k); h["r:a"] != "4:4:x:y" || h["r:b"] != "2:6:z" {
		t.Fatalf("records rewritten: %v", h)
	}
	if r := ok(t, "replay")(e.fwSettle(fwSettle(k, 10, 1, "b"))); !r.Replay || r.Used != 3 {
		t.Fatalf("settlement with more fields = %+v, want a replay", r)
	}
}

func TestSettleHealsAKeyWithoutTTL(t *testing.T) {
	e := setup(t)
	k := e.key("persist")
	e.take(args(k, 10, 5, "a"))
	e.mustDo("PERSIST", k)
	r := ok(t, "settle")(e.fwSettle(fwSettle(k, 10, 2, "a")))
	if !r.Settled || !r.Healed || r.Used != 2 {
		t.Fatalf("settle on a window without TTL = %+v, want healed", r)
	}
	if p := e.pttl(k); p <= 0 || p > minute {
		t.Fatalf("PTTL after healing = %d", p)
	}
}

func TestSlidingWindowSettle(t *testing.T) {
	e := setup(t)
	k := e.swKey("u")
	e.swTake(sw(k, 10, 6, "a"))
	r := ok(t, "settle lower")(e.swSettle(swSettle(k, 10, 2, "a")))
	if !r.Settled || r.Replay || r.Reserved != 6 || r.Used != 2 || r.RetryAfterMS != 0 {
		t.Fatalf("settle of 6 at 2 = %+v, want used 2", r)
	}
	if h := e.hash(k); h["c"] != "2" {
		t.Fatalf("current count = %q, want 2 (%v)", h["c"], h)
	}
	if r := ok(t, "replay")(e.swSettle(swSettle(k, 10, 2, "a"))); !r.Replay || r.Used != 2 {
		t.Fatalf("replay = %+v", r)
	}
	if _, err := e.swSettle(swSettle(k, 10, 3, "a")); !errors.Is(err, luascript.ErrConflict) {
		t.Fatalf("settle at another cost = %v, want CONFLICT", err)
	}
	e.swTake(sw(k, 10, 1, "b"))
	r = ok(t, "settle higher")(e.swSettle(swSettle(k, 10, 20, "b")))
	if r.Used != 22 || r.RetryAfterMS <= 0 {
		t.Fatalf("settle of 1 at 20 = %+v, want used 22 and a wait", r)
	}
	if tr := e.swTake(sw(k, 10, 1, "")); tr.Allowed {
		t.Fatalf("take after the overrun = %+v, want denied", tr)
	}
	if r := ok(t, "unknown")(e.swSettle(swSettle(k, 10, 0, "zz"))); r.Settled || r.Used != 22 {
		t.Fatalf("settle of an unknown id = %+v", r)
	}
	if _, err := e.swSettle(luascript.Args{Key: k, Limit: 9, WindowMS: bigW, Cost: 1, RequestID: "a", Strict: true}); !errors.Is(err, luascript.ErrPolicy) {
		t.Fatalf("strict settle under other limits = %v, want POLICY", err)
	}
}

// A take counted in the previous period moves p; one in the current
// period moves c; one that slid out is the no-op answer; so is one whose
// record names no period of the stored window.
func TestSlidingWindowSettleFindsTheTakesPeriod(t *testing.T) {
	e := setup(t)
	k := e.swKey("periods")
	now, start := e.nowMS()
	w := int64(bigW)
	f := strconv.FormatInt
	e.mustDo("HSET", k, "s", f(start, 10), "c", "3", "p", "5", "policy", "10:"+f(w, 10), "ids", "4", "qh", "0", "qt", "0",
		"r:prev", "4:4:"+f(start+w, 10), "r:cur", "3:8:"+f(start+2*w, 10),
		"r:out", "2:2:"+f(now-1, 10), "r:odd", "1:1:"+f(start+w+7, 10))
	e.mustDo("PEXPIRE", k, f(start+2*w-now, 10))

	if r := ok(t, "prev")(e.swSettle(swSettle(k, 10, 1, "prev"))); !r.Settled || r.Reserved != 4 {
		t.Fatalf("settle of a take of the previous period = %+v", r)
	}
	if r := ok(t, "cur")(e.swSettle(swSettle(k, 10, 0, "cur"))); !r.Settled || r.Reserved != 3 {
		t.Fatalf("settle of a take of the current period = %+v", r)
	}
	if h := e.hash(k); h["p"] != "2" || h["c"] != "0" || h["s"] != f(start, 10) {
		t.Fatalf("counts after the settles: %v, want p 2, c 0", h)
	}
	for _, id := range []string{"out", "odd"} {
		before := e.hash(k)
		if r := ok(t, id)(e.swSettle(swSettle(k, 10, 0, id))); r.Settled {
			t.Fatalf("settle of %s = %+v, want the no-op answer", id, r)
		}
		sameHash(t, "after settling "+id, e.hash(k), before)
	}
}

// A settlement left by an earlier take of the same id is replaced, and
// every settle forgets up to three settlements past their expiry.
func TestSettlementsStayBounded(t *testing.T) {
	e := setup(t)
	k := e.swKey("bounded")
	now, start := e.nowMS()
	w := int64(bigW)
	f := strconv.FormatInt
	live := f(start+2*w, 10)
	e.mustDo("HSET", k, "s", f(start, 10), "c", "5", "p", "0", "policy", "10:"+f(w, 10), "ids", "1", "qh", "0", "qt", "1",
		"q:0", "a:"+live, "r:a", "5:5:"+live, "s:a", "1:"+f(now-5, 10),
		"sh", "0", "st", "5", "sq:0", "o0:1", "sq:1", "o1:1", "sq:2", "a:"+f(now-5, 10), "sq:3", "o3:1", "sq:4", "o4:1",
		"s:o0", "1:1", "s:o1", "1:1", "s:o3", "1:1", "s:o4", "1:1")
	e.mustDo("PEXPIRE", k, f(start+2*w-now, 10))

	r := ok(t, "settle")(e.swSettle(swSettle(k, 10, 2, "a")))
	if !r.Settled || r.Replay || r.Used != 2 {
		t.Fatalf("settle over a stale settlement = %+v, want settled anew", r)
	}
	h := e.hash(k)
	if h["s:a"] != "2:"+live || h["sh"] != "3" || h["st"] != "6" || h["sq:5"] != "a:"+live {
		t.Fatalf("settlement fields: %v", h)
	}
	for _, gone := range []string{"sq:0", "sq:1", "sq:2", "s:o0", "s:o1"} {
		if _, ok := h[gone]; ok {
			t.Fatalf("%s not forgotten: %v", gone, h)
		}
	}
	for _, kept := range []string{"sq:3", "sq:4", "s:o3", "s:o4"} {
		if _, ok := h[kept]; !ok {
			t.Fatalf("%s forgotten beyond three: %v", kept, h)
		}
	}
}

func TestTokenBucketSettle(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	a := slowBucket(k, 10, 5, "a")
	e.tbTake(a)
	ttl := e.pttl(k)

	r := ok(t, "settle lower")(e.tbSettle(tbSettle(a, 2, "a")))
	if !r.Settled || r.Replay || r.Reserved != 5 || r.Remaining != 8 || r.RetryAfterMS != 0 {
		t.Fatalf("settle of 5 at 2 = %+v, want 8 tokens left", r)
	}
	if p := e.pttl(k); p < ttl-1000 {
		t.Fatalf("PTTL %d after giving back, %d before: the record must stay for its horizon", p, ttl)
	}
	if r := ok(t, "replay")(e.tbSettle(tbSettle(a, 2, "a"))); !r.Replay || r.Remaining != 8 {
		t.Fatalf("replay = %+v", r)
	}
	if _, err := e.tbSettle(tbSettle(a, 3, "a")); !errors.Is(err, luascript.ErrConflict) {
		t.Fatalf("settle at another cost = %v, want CONFLICT", err)
	}
	if tr := e.tbTake(a); !tr.Replay {
		t.Fatalf("take replay after the settle = %+v", tr)
	}

	// 8 left; a take of 5 leaves 3 (7 missing); settled at 20 the bucket
	// owes 22 tokens: empty, and a token is due 13 hours on.
	b := slowBucket(k, 10, 5, "b")
	e.tbTake(b)
	r = ok(t, "settle higher")(e.tbSettle(tbSettle(b, 20, "b")))
	if r.Remaining != 0 || r.RetryAfterMS > 13*hour || r.RetryAfterMS < 13*hour-1000 || r.ResetMS < 22*hour-1000 {
		t.Fatalf("settle of 5 at 20 = %+v, want empty, a token in 13 h, full in 22 h", r)
	}
	if p := e.pttl(k); p < r.ResetMS-1000 {
		t.Fatalf("PTTL %d, want the bucket kept until full (%d ms)", p, r.ResetMS)
	}
	if tr := e.tbTake(slowBucket(k, 10, 1, "")); tr.Allowed {
		t.Fatalf("take after the overrun = %+v, want denied", tr)
	}
	// A refund moves the TAT back.
	c := slowBucket(e.tbKey("refund"), 10, 3, "c")
	e.tbTake(c)
	if r := ok(t, "refund")(e.tbSettle(tbSettle(c, 0, "c"))); !r.Settled || r.Remaining != 10 || r.ResetMS != 0 {
		t.Fatalf("refund = %+v, want a full bucket again", r)
	}
}

// Giving back never fills a bucket past its burst, and an overrun never
// moves the TAT more than MAX_WINDOW_MS past now.
func TestTokenBucketSettleBounds(t *testing.T) {
	e := setup(t)
	k := e.tbKey("bounds")
	a := slowBucket(k, 10, 1, "a")
	e.tbTake(a)
	// Another writer's take of 5 the bucket has already refilled.
	e.mustDo("HSET", k, "tat", "0", "rem", "0", "r:f", "5:10:99999999999999")
	r := ok(t, "refund")(e.tbSettle(tbSettle(a, 0, "f")))
	if !r.Settled || r.Remaining != 10 || r.ResetMS != 0 {
		t.Fatalf("refund into a full bucket = %+v, want 10 tokens, no more", r)
	}
	now := e.redisTimeUS()
	r = ok(t, "overrun")(e.tbSettle(tbSettle(a, luascript.MaxLimit, "a")))
	if r.Remaining != 0 || r.ResetMS > luascript.MaxWindowMS || r.ResetMS < luascript.MaxWindowMS-1000 {
		t.Fatalf("overrun of 1e9 = %+v, want the TAT MAX_WINDOW_MS on", r)
	}
	tat, err := strconv.ParseInt(e.hash(k)["tat"], 10, 64)
	if err != nil || tat-now > luascript.MaxWindowMS*1000+1_000_000 {
		t.Fatalf("tat %d, now %d: %v", tat, now, err)
	}
	// The bucket still takes and peeks.
	if p := e.tbPeek(a); p.Remaining != 0 {
		t.Fatalf("peek after the overrun = %+v", p)
	}
}

func TestTokenBucketSettleForgottenRecordIsANoOp(t *testing.T) {
	e := setup(t)
	k := e.tbKey("forgot")
	a := slowBucket(k, 10, 1, "a")
	e.tbTake(a)
	e.mustDo("HSET", k, "r:old", "3:7:1")
	before := e.hash(k)
	r := ok(t, "past the horizon")(e.tbSettle(tbSettle(a, 0, "old")))
	if r.Settled || r.Remaining != 9 {
		t.Fatalf("settle of a record past its horizon = %+v, want the no-op answer, 9 left", r)
	}
	sameHash(t, "after the no-op", e.hash(k), before)
	if r := ok(t, "no bucket")(e.tbSettle(tbSettle(slowBucket(e.tbKey("none"), 10, 1, ""), 0, "x"))); r.Settled || r.Remaining != 10 {
		t.Fatalf("settle with no bucket = %+v, want the no-op answer of a full bucket", r)
	}
}

func TestCalendarSettle(t *testing.T) {
	e := setup(t)
	c := utcDay
	c.Limit = 10
	now := e.redisNow()
	a := e.cal(c, "u", now, 6, "a")
	e.calTake(a)
	s := luascript.Args{Key: a.Key, Spec: a.Spec, Limit: a.Limit, Periods: a.Periods, Cost: 1, RequestID: "a"}
	r := ok(t, "settle")(e.calSettle(s))
	if !r.Settled || r.Reserved != 6 || r.Used != 1 || r.ResetMS <= 0 {
		t.Fatalf("settle of 6 at 1 = %+v", r)
	}
	if r := ok(t, "replay")(e.calSettle(s)); !r.Replay || r.Used != 1 {
		t.Fatalf("replay = %+v", r)
	}
	s.Cost = 2
	if _, err := e.calSettle(s); !errors.Is(err, luascript.ErrConflict) {
		t.Fatalf("settle at another cost = %v", err)
	}
	s.Cost, s.RequestID = 30, "b"
	e.calTake(e.cal(c, "u", now, 1, "b"))
	r = ok(t, "overrun")(e.calSettle(s))
	if r.Used != 31 || r.RetryAfterMS != r.ResetMS {
		t.Fatalf("settle of 1 at 30 = %+v, want used 31", r)
	}
	s.RequestID = "never"
	if r := ok(t, "unknown")(e.calSettle(s)); r.Settled || r.Used != 31 {
		t.Fatalf("unknown id = %+v", r)
	}
	other := luascript.Args{Key: luascript.CalendarKey(e.prefix, "pol", "nobody"), Spec: a.Spec, Limit: a.Limit, Periods: a.Periods, Cost: 1, RequestID: "a"}
	if r := ok(t, "no window")(e.calSettle(other)); r.Settled || r.ResetMS <= 0 {
		t.Fatalf("settle with no window = %+v, want the no-op answer with the period's reset", r)
	}
	// Periods an hour off Redis's clock: CLOCK_SKEW, as for a take.
	skew := e.cal(c, "u", now.Add(-72*time.Hour), 1, "a")
	s = luascript.Args{Key: a.Key, Spec: a.Spec, Limit: a.Limit, Periods: skew.Periods, Cost: 1, RequestID: "a"}
	if _, err := e.calSettle(s); err == nil || !strings.Contains(err.Error(), "CLOCK_SKEW") {
		t.Fatalf("settle with periods far from Redis's clock = %v, want CLOCK_SKEW", err)
	}
}

func TestSettleValidatesBeforeRedis(t *testing.T) {
	cases := []struct {
		name string
		call func() (luascript.Call, error)
	}{
		{"no request id", func() (luascript.Call, error) {
			return luascript.SettleCall(limits.FixedWindow, fwSettle("k", 10, 1, ""))
		}},
		{"bad request id", func() (luascript.Call, error) {
			return luascript.SettleCall(limits.SlidingWindow, swSettle("k", 10, 1, "a b"))
		}},
		{"negative cost", func() (luascript.Call, error) {
			return luascript.SettleCall(limits.FixedWindow, fwSettle("k", 10, -1, "a"))
		}},
		{"cost above MaxLimit", func() (luascript.Call, error) {
			return luascript.SettleCall(limits.FixedWindow, fwSettle("k", 10, luascript.MaxLimit+1, "a"))
		}},
		{"no key", func() (luascript.Call, error) {
			return luascript.SettleCall(limits.FixedWindow, fwSettle("", 10, 1, "a"))
		}},
		{"limit 0", func() (luascript.Call, error) {
			return luascript.SettleCall(limits.SlidingWindow, swSettle("k", 0, 1, "a"))
		}},
		{"bucket dedupe 0", func() (luascript.Call, error) {
			a := tbSettle(slowBucket("k", 10, 1, ""), 1, "a")
			a.DedupeMS = 0
			return luascript.SettleCall(limits.TokenBucket, a)
		}},
		{"bucket rate 0", func() (luascript.Call, error) {
			a := tbSettle(slowBucket("k", 10, 1, ""), 1, "a")
			a.Rate = 0
			return luascript.SettleCall(limits.TokenBucket, a)
		}},
		{"calendar no periods", func() (luascript.Call, error) {
			return luascript.SettleCall(limits.Calendar, luascript.Args{Key: "k", Spec: "1:day:UTC:-:0", Limit: 1, RequestID: "a"})
		}},
	}
	for _, tc := range cases {
		if _, err := tc.call(); !errors.Is(err, luascript.ErrInvalid) {
			t.Errorf("%s: %v, want INVALID", tc.name, err)
		}
	}
}

// Every refusal of a settle script leaves its key as it found it, but for
// a restored TTL, which the refusal then says. The scripts run as Redis
// holds them (EVAL), past Go's validation.
func TestSettleRefusalsWriteNothing(t *testing.T) {
	e := setup(t)
	const (
		fw  = "fixed_window_settle.lua"
		sws = "sliding_window_settle.lua"
		tbs = "token_bucket_settle.lua"
	)
	now, start := e.nowMS()
	f := strconv.FormatInt
	win := state{{"HSET", "K", "used", "5", "policy", "10:60000", "ids", "2", "r:a", "5:5", "r:bad", "x", "s:a", "2", "r:c", "1:6", "s:c", "y"}}
	slide := state{{"HSET", "K", "s", f(start, 10), "c", "5", "p", "0", "policy", "10:" + f(bigW, 10), "ids", "2",
		"r:a", "5:5:" + f(start+2*bigW, 10), "s:a", "2:" + f(start+2*bigW, 10), "r:bad", "5:5", "r:c", "1:6:" + f(start+2*bigW, 10), "s:c", "z"}}
	bkt := state{{"HSET", "K", "tat", f(now*1000, 10), "rem", "0", "policy", "1:3600000:10", "ids", "2",
		"r:a", "5:5:99999999999999", "s:a", "2:99999999999999", "r:bad", "5", "r:c", "1:4:99999999999999", "s:c", "q"}}
	badFields := state{{"HSET", "K", "used", "x", "tat", "x", "s", "x", "policy", "?"}}
	fwArgs := func(limit, cost, strict, id string) []string { return []string{limit, "60000", cost, strict, id} }
	swArgs := func(limit, cost, strict, id string) []string { return []string{limit, f(bigW, 10), cost, strict, id} }
	tbArgs := func(rate, cost, strict, id string) []string {
		return []string{rate, "3600000", "10", cost, "36000000", strict, id}
	}
	cases := []struct {
		name   string
		script string
		state  state
		argv   []string
		code   string
		heals  bool
	}{
		{"fw: limit 0", fw, win, fwArgs("0", "1", "0", "a"), "INVALID", false},
		{"fw: cost too big", fw, win, fwArgs("10", "1000000001", "0", "a"), "INVALID", false},
		{"fw: cost -1", fw, win, fwArgs("10", "-1", "0", "a"), "INVALID", false},
		{"fw: no request id", fw, win, fwArgs("10", "1", "0", ""), "INVALID", false},
		{"fw: strict 2", fw, win, fwArgs("10", "1", "2", "a"), "INVALID", false},
		{"fw: too few arguments", fw, win, []string{"10", "60000", "1", "0"}, "INVALID", false},
		{"fw: strict, other policy", fw, win, fwArgs("9", "1", "1", "a"), "POLICY", true},
		{"fw: other cost", fw, win, fwArgs("10", "1", "0", "a"), "CONFLICT", true},
		{"fw: malformed record", fw, win, fwArgs("10", "1", "0", "bad"), "WRONGTYPE", true},
		{"fw: malformed settlement", fw, win, fwArgs("10", "1", "0", "c"), "WRONGTYPE", true},
		{"fw: other fields", fw, badFields, fwArgs("10", "1", "0", "a"), "WRONGTYPE", false},
		{"fw: a string", fw, aString, fwArgs("10", "1", "0", "a"), "WRONGTYPE", false},
		{"fw: invalid on no key", fw, noKey, fwArgs("10", "x", "0", "a"), "INVALID", false},

		{"sw: window 0", sws, slide, []string{"10", "0", "1", "0", "a"}, "INVALID", false},
		{"sw: cost 1.5", sws, slide, swArgs("10", "1.5", "0", "a"), "INVALID", false},
		{"sw: bad request id", sws, slide, swArgs("10", "1", "0", "a:b"), "INVALID", false},
		{"sw: strict, other policy", sws, slide, swArgs("9", "1", "1", "a"), "POLICY", true},
		{"sw: other cost", sws, slide, swArgs("10", "1", "0", "a"), "CONFLICT", true},
		{"sw: malformed record", sws, slide, swArgs("10", "1", "0", "bad"), "WRONGTYPE", true},
		{"sw: malformed settlement", sws, slide, swArgs("10", "1", "0", "c"), "WRONGTYPE", true},
		{"sw: other fields", sws, badFields, swArgs("10", "1", "0", "a"), "WRONGTYPE", false},
		{"sw: a string", sws, aString, swArgs("10", "1", "0", "a"), "WRONGTYPE", false},

		{"tb: refill over 31 days", tbs, bkt, []string{"1", "2678400000", "2", "1", "1000", "0", "a"}, "INVALID", false},
		{"tb: dedupe 0", tbs, bkt, []string{"1", "3600000", "10", "1", "0", "0", "a"}, "INVALID", false},
		{"tb: no request id", tbs, bkt, tbArgs("1", "1", "0", ""), "INVALID", false},
		{"tb: strict, other policy", tbs, bkt, tbArgs("2", "1", "1", "a"), "POLICY", true},
		{"tb: other cost", tbs, bkt, tbArgs("1", "1", "0", "a"), "CONFLICT", true},
		{"tb: malformed record", tbs, bkt, tbArgs("1", "1", "0", "bad"), "WRONGTYPE", true},
		{"tb: malformed settlement", tbs, bkt, tbArgs("1", "1", "0", "c"), "WRONGTYPE", true},
		{"tb: other fields", tbs, badFields, tbArgs("1", "1", "0", "a"), "WRONGTYPE", false},
		{"tb: a string", tbs, aString, tbArgs("1", "1", "0", "a"), "WRONGTYPE", false},
	}
	for _, tc := range cases {
		for _, persist := range []bool{false, true} {
			if persist && len(tc.state) == 0 {
				continue
			}
			name := tc.name
			if persist {
				name += ", no TTL"
			}
			t.Run(name, func(t *testing.T) {
				k := e.prefix + "k:" + name
				for _, cmd := range tc.state {
					cmd = append([]string(nil), cmd...)
					cmd[1] = k
					e.mustDo(cmd...)
				}
				if len(tc.state) > 0 && !persist {
					e.mustDo("PEXPIRE", k, "600000")
				}
				t.Cleanup(func() { e.mustDo("DEL", k) })
				before, ttlBefore := e.dump(k), e.pttl(k)
				src := luascript.ScriptText(tc.script)
				if src == "" {
					t.Fatalf("no script %s", tc.script)
				}
				err := e.c.Do(t.Context(), e.c.B().Eval().Script(src).Numkeys(1).Key(k).Arg(tc.argv...).Build()).Error()
				if err == nil || !strings.HasPrefix(err.Error(), tc.code+" ") {
					t.Fatalf("%s %q = %v, want %s", tc.script, tc.argv, err, tc.code)
				}
				if after := e.dump(k); after != before {
					t.Errorf("%s wrote the key: before %q, after %q", tc.code, before, after)
				}
				healed := strings.HasSuffix(err.Error(), " TTL_RESTORED")
				switch ttl := e.pttl(k); {
				case len(tc.state) == 0:
					if ttl != -2 {
						t.Errorf("%s created the key: PTTL %d", tc.code, ttl)
					}
				case !persist:
					if ttl <= 0 || ttl > ttlBefore || healed {
						t.Errorf("PTTL %d before, %d after, healed %v", ttlBefore, ttl, healed)
					}
				case tc.heals:
					if ttl <= 0 || !healed {
						t.Errorf("without TTL: PTTL %d, healed %v (%v); want a TTL restored and said", ttl, healed, err)
					}
				default:
					if ttl != -1 || healed {
						t.Errorf("without TTL: PTTL %d, healed %v; want none written", ttl, healed)
					}
				}
			})
		}
	}
}

// Under maxmemory a settle that writes is refused before it writes
// anything; a replay and a no-op answer, which write nothing, still answer.
func TestFullRedisRefusesASettleWhole(t *testing.T) {
	e := setup(t)
	e.mustDo("CONFIG", "SET", "maxmemory-policy", "noeviction")
	fw, sk, bk := e.key("full"), e.swKey("full"), e.tbKey("full")
	e.take(args(fw, 10, 5, "a"))
	e.take(args(fw, 10, 5, "b"))
	e.swTake(sw(sk, 10, 5, "a"))
	ba := slowBucket(bk, 10, 5, "a")
	e.tbTake(ba)
	if _, err := e.fwSettle(fwSettle(fw, 10, 1, "b")); err != nil {
		t.Fatal(err)
	}
	before := map[string]map[string]string{fw: e.hash(fw), sk: e.hash(sk), bk: e.hash(bk)}

	e.mustDo("CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() {
		if err := e.c.Do(context.Background(), e.c.B().Arbitrary("CONFIG", "SET", "maxmemory", "0").Build()).Error(); err != nil {
			t.Errorf("CONFIG SET maxmemory 0: %v", err)
		}
	})
	oom := func(what string, err error) {
		t.Helper()
		var re *rueidis.RedisError
		if !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "OOM") {
			t.Fatalf("%s on a full Redis: %v, want Redis's OOM refusal", what, err)
		}
	}
	_, err := e.fwSettle(fwSettle(fw, 10, 1, "a"))
	oom("fixed window settle", err)
	_, err = e.swSettle(swSettle(sk, 10, 1, "a"))
	oom("sliding window settle", err)
	_, err = e.tbSettle(tbSettle(ba, 1, "a"))
	oom("token bucket settle", err)
	for k, h := range before {
		sameHash(t, k+" after refused settles", e.hash(k), h)
	}
	if r := ok(t, "replay")(e.fwSettle(fwSettle(fw, 10, 1, "b"))); !r.Replay {
		t.Fatalf("replay on a full Redis = %+v", r)
	}
	if r := ok(t, "no-op")(e.fwSettle(fwSettle(fw, 10, 1, "zz"))); r.Settled {
		t.Fatalf("no-op on a full Redis = %+v", r)
	}
}

// Concurrent takes of cost 5 each settled at 1 to 5: no take is accepted
// past the limit, and the final use is the sum of the settled costs.
func TestConcurrentTakeThenSettleNeverOverAdmits(t *testing.T) {
	e := setup(t)
	k := e.key("race")
	const limit, n = 40, 50
	var mu sync.Mutex
	var settled int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("r%d", i)
			tr, err := luascript.Take(context.Background(), e.c, limits.FixedWindow, args(k, limit, 5, id))
			if err != nil {
				errs <- err
				return
			}
			if !tr.Allowed {
				return
			}
			if tr.Used > limit {
				errs <- fmt.Errorf("take %s accepted at used %d > %d", id, tr.Used, limit)
			}
			cost := int64(i%5 + 1)
			sr, err := e.fwSettleCtx(context.Background(), fwSettle(k, limit, cost, id))
			if err != nil || !sr.Settled {
				errs <- fmt.Errorf("settle %s: %+v, %v", id, sr, err)
				return
			}
			mu.Lock()
			settled += cost
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := e.hash(k)["used"]; got != strconv.FormatInt(settled, 10) {
		t.Fatalf("used = %s, want the sum of settled costs %d", got, settled)
	}
}

func (e *env) fwSettleCtx(ctx context.Context, a luascript.Args) (luascript.Result, error) {
	call, err := luascript.SettleCall(limits.FixedWindow, a)
	if err != nil {
		return luascript.Result{}, err
	}
	return luascript.ParseSettle(call.Exec(ctx, e.c))
}

// The embedded store runs the settle scripts too.
func TestSettleOnMiniredis(t *testing.T) {
	_, c := startMiniredis(t)
	e := &env{t: t, c: c, prefix: randomPrefix(t)}
	fw := e.key("u")
	e.take(args(fw, 10, 5, "a"))
	if r := ok(t, "fw")(e.fwSettle(fwSettle(fw, 10, 2, "a"))); !r.Settled || r.Used != 2 {
		t.Fatalf("fixed window settle = %+v", r)
	}
	sk := e.swKey("u")
	e.swTake(sw(sk, 10, 5, "a"))
	if r := ok(t, "sw")(e.swSettle(swSettle(sk, 10, 2, "a"))); !r.Settled || r.Used != 2 {
		t.Fatalf("sliding window settle = %+v", r)
	}
	a := slowBucket(e.tbKey("u"), 10, 5, "a")
	e.tbTake(a)
	if r := ok(t, "tb")(e.tbSettle(tbSettle(a, 2, "a"))); !r.Settled || r.Remaining != 8 {
		t.Fatalf("token bucket settle = %+v", r)
	}
	if r := ok(t, "tb replay")(e.tbSettle(tbSettle(a, 2, "a"))); !r.Replay {
		t.Fatalf("token bucket settle replay = %+v", r)
	}
}

// used stays within 0..MAX_LIMIT whatever another writer left.
func TestFixedWindowSettleKeepsUsedInBounds(t *testing.T) {
	e := setup(t)
	k := e.key("bounds")
	big := strconv.FormatInt(luascript.MaxLimit-1, 10)
	e.mustDo("HSET", k, "used", big, "policy", "10:60000", "ids", "2", "r:a", "1:"+big, "r:b", "5:5")
	e.mustDo("PEXPIRE", k, "60000")
	if r := ok(t, "up")(e.fwSettle(fwSettle(k, 10, luascript.MaxLimit, "a"))); r.Used != luascript.MaxLimit {
		t.Fatalf("settle past MAX_LIMIT = %+v, want used saturated at %d", r, int64(luascript.MaxLimit))
	}
	e.mustDo("HSET", k, "used", "2")
	if r := ok(t, "down")(e.fwSettle(fwSettle(k, 10, 0, "b"))); r.Used != 0 {
		t.Fatalf("refund of more than is used = %+v, want used 0", r)
	}
}

// A calendar settle's refusals write nothing, and a window without TTL
// gets its period's end back.
func TestCalendarSettleRefusalsAndHealing(t *testing.T) {
	e := setup(t)
	c := utcDay
	c.Limit = 10
	a := e.cal(c, "h", e.redisNow(), 4, "a")
	e.calTake(a)
	keys := []string{}
	for _, s := range a.Periods.Starts {
		keys = append(keys, luascript.CalendarPeriodKey(a.Key, s))
	}
	var key string
	for _, k := range keys {
		if e.pttl(k) > 0 {
			key = k
		}
	}
	if key == "" {
		t.Fatal("the take wrote no period's window")
	}
	settle := func(cost int64, spec string, strict bool) (luascript.Result, error) {
		return e.calSettle(luascript.Args{Key: a.Key, Spec: spec, Limit: a.Limit, Periods: a.Periods,
			Cost: cost, RequestID: "a", Strict: strict})
	}
	other := limits.CalendarWindow{Limit: 10, Period: limits.PeriodDay, TimeZone: "Asia/Shanghai", WeekStart: time.Monday}
	before := e.hash(key)
	if _, err := settle(1, other.Spec(), true); !errors.Is(err, luascript.ErrPolicy) {
		t.Fatalf("strict settle under another spec = %v, want POLICY", err)
	}
	sameHash(t, "after POLICY", e.hash(key), before)
	e.mustDo("HSET", key, "r:bad", "x")
	before = e.hash(key)
	if _, err := e.calSettle(luascript.Args{Key: a.Key, Spec: a.Spec, Limit: a.Limit, Periods: a.Periods, Cost: 1, RequestID: "bad"}); !errors.Is(err, luascript.ErrWrongType) {
		t.Fatalf("settle of a malformed record = %v, want WRONGTYPE", err)
	}
	sameHash(t, "after refusals", e.hash(key), before)
	e.mustDo("PERSIST", key)
	r := ok(t, "heal")(settle(1, a.Spec, false))
	if !r.Settled || !r.Healed || r.Used != 1 {
		t.Fatalf("settle on a period without TTL = %+v, want healed", r)
	}
	if p := e.pttl(key); p <= 0 || p > 86_400_000+1000 {
		t.Fatalf("PTTL after healing = %d, want the period's end", p)
	}
}

func TestSlidingWindowSettleNoWindowAndHealing(t *testing.T) {
	e := setup(t)
	if r := ok(t, "none")(e.swSettle(swSettle(e.swKey("none"), 10, 1, "a"))); r != (luascript.Result{Remaining: 10}) {
		t.Fatalf("settle with no window = %+v", r)
	}
	k := e.swKey("heal")
	e.swTake(sw(k, 10, 4, "a"))
	e.mustDo("PERSIST", k)
	r := ok(t, "heal")(e.swSettle(swSettle(k, 10, 1, "a")))
	if !r.Settled || !r.Healed || r.Used != 1 {
		t.Fatalf("settle on a window without TTL = %+v", r)
	}
	if p := e.pttl(k); p <= 0 || p > 2*bigW {
		t.Fatalf("PTTL after healing = %d", p)
	}
}

// Under a named policy whose rate changed, a settle rebases the TAT to the
// new rate and writes the policy with it, as a take does; its settlements
// are forgotten as the sliding window's are.
func TestTokenBucketSettlePolicyChangeAndForgetting(t *testing.T) {
	e := setup(t)
	k := e.tbKey("changed")
	a := slowBucket(k, 10, 4, "a")
	e.tbTake(a)
	e.mustDo("HSET", k, "sh", "0", "st", "3", "sq:0", "o0:1", "sq:1", "o1:1", "sq:2", "o2:99999999999999",
		"s:o0", "1:1", "s:o1", "1:99999999999999", "s:o2", "1:99999999999999")
	changed := tbSettle(a, 1, "a")
	changed.Rate = 2
	r := ok(t, "settle")(e.tbSettle(changed))
	if !r.Settled || r.Reserved != 4 {
		t.Fatalf("settle under a changed rate = %+v", r)
	}
	h := e.hash(k)
	if h["policy"] != "2:3600000:10" {
		t.Fatalf("policy = %q, want the new rate's", h["policy"])
	}
	// sq:0 and s:o0 expired; sq:1 expired but its settlement was renewed
	// since (it stays); sq:2 is live, so the head stops there.
	if _, ok := h["s:o0"]; ok || h["sh"] != "2" || h["st"] != "4" || h["s:o1"] == "" || h["sq:2"] == "" {
		t.Fatalf("settlement queue after the settle: %v", h)
	}
	if _, ok := h["sq:0"]; ok {
		t.Fatalf("sq:0 not forgotten: %v", h)
	}
}

// Settles mix with takes in one ExecMulti, in order, on Redis (after a
// script flush too: NOSCRIPT is resent) and on the embedded store.
func TestExecMultiMixesTakesAndSettles(t *testing.T) {
	for _, store := range []string{"redis", "redis-after-script-flush", "embedded"} {
		t.Run(store, func(t *testing.T) {
			var e *env
			if store == "embedded" {
				_, c := startMiniredis(t)
				e = &env{t: t, c: c, prefix: randomPrefix(t)}
			} else {
				e = setup(t)
			}
			if store == "redis-after-script-flush" {
				e.mustDo("SCRIPT", "FLUSH")
			}
			fw, sk := e.key("m"), e.swKey("m")
			b := slowBucket(e.tbKey("m"), 10, 5, "b")
			var calls []luascript.Call
			add := func(c luascript.Call, err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				calls = append(calls, c)
			}
			add(luascript.TakeCall(limits.FixedWindow, args(fw, 10, 6, "a")))         // 0
			add(luascript.SettleCall(limits.FixedWindow, fwSettle(fw, 10, 1, "a")))   // 1: used 1
			add(luascript.TakeCall(limits.FixedWindow, args(fw, 10, 9, "c")))         // 2: fits after the settle
			add(luascript.TakeCall(limits.SlidingWindow, sw(sk, 10, 4, "s")))         // 3
			add(luascript.SettleCall(limits.SlidingWindow, swSettle(sk, 10, 0, "s"))) // 4: used 0
			add(luascript.TakeCall(limits.TokenBucket, b))                            // 5: 5 left
			add(luascript.SettleCall(limits.TokenBucket, tbSettle(b, 1, "b")))        // 6: 9 left
			add(luascript.SettleCall(limits.FixedWindow, fwSettle(fw, 10, 2, "a")))   // 7: CONFLICT
			add(luascript.SettleCall(limits.TokenBucket, tbSettle(b, 1, "b")))        // 8: replay
			res := luascript.ExecMulti(t.Context(), e.c, calls)
			want(t, 0, luascript.ParseTake, res[0], func(r luascript.Result) bool { return r.Allowed && r.Used == 6 })
			want(t, 1, luascript.ParseSettle, res[1], func(r luascript.Result) bool { return r.Settled && r.Used == 1 })
			want(t, 2, luascript.ParseTake, res[2], func(r luascript.Result) bool { return r.Allowed && r.Used == 10 })
			want(t, 3, luascript.ParseTake, res[3], func(r luascript.Result) bool { return r.Allowed && r.Used == 4 })
			want(t, 4, luascript.ParseSettle, res[4], func(r luascript.Result) bool { return r.Settled && r.Used == 0 })
			want(t, 5, luascript.ParseTake, res[5], func(r luascript.Result) bool { return r.Allowed && r.Remaining == 5 })
			want(t, 6, luascript.ParseSettle, res[6], func(r luascript.Result) bool { return r.Settled && r.Remaining == 9 })
			if r, err := luascript.ParseSettle(res[7]); !errors.Is(err, luascript.ErrConflict) {
				t.Errorf("call 7 = %+v, %v; want CONFLICT", r, err)
			}
			want(t, 8, luascript.ParseSettle, res[8], func(r luascript.Result) bool { return r.Replay && r.Remaining == 9 })
		})
	}
}
