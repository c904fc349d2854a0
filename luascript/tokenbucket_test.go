package luascript_test

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"quotad/limits"
	"quotad/luascript"
)

// tb is a bucket of burst tokens refilled rate per second.
func tb(key string, rate, burst, cost int64, id string) luascript.Args {
	b := luascript.TokenBucket{Rate: rate, PeriodMS: 1000, Burst: burst}
	return luascript.Args{
		Key: key, TokenBucket: b, Cost: cost, RequestID: id,
		DedupeMS: b.RefillMS(), MaxRequestIDs: 100,
	}
}

func (e *env) tbKey(subject string) string {
	return luascript.TokenBucketKey(e.prefix, "pol", subject)
}

func (e *env) tbTake(a luascript.Args) luascript.Result {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.TokenBucket, a)
	if err != nil {
		e.t.Fatalf("token bucket take %+v: %v", a, err)
	}
	return r
}

func (e *env) tbTakeErr(a luascript.Args, want error) error {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.TokenBucket, a)
	if !errors.Is(err, want) {
		e.t.Fatalf("token bucket take %+v = %+v, %v; want %v", a, r, err, want)
	}
	return err
}

func (e *env) tbPeek(a luascript.Args) luascript.Result {
	e.t.Helper()
	r, err := luascript.Peek(e.t.Context(), e.c, limits.TokenBucket, luascript.Args{Key: a.Key, TokenBucket: a.TokenBucket, Strict: a.Strict})
	if err != nil {
		e.t.Fatalf("token bucket peek %+v: %v", a, err)
	}
	return r
}

// redisTimeUS is Redis's clock, the one the scripts use, in µs.
func (e *env) redisTimeUS() int64 {
	e.t.Helper()
	v, err := e.do("TIME").AsStrSlice()
	if err != nil || len(v) != 2 {
		e.t.Fatalf("TIME = %v, %v", v, err)
	}
	s, err1 := strconv.ParseInt(v[0], 10, 64)
	us, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		e.t.Fatalf("TIME = %v", v)
	}
	return s*1_000_000 + us
}

// A bucket of 1 token per hour cannot refill during the test, so every
// figure is exact.
func TestTokenBucketBurstThenDeny(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	slow := func(cost int64, id string) luascript.Args {
		a := tb(k, 1, 3, cost, id)
		a.PeriodMS = 3_600_000 // one token per hour
		a.DedupeMS = a.RefillMS()
		return a
	}
	if p := e.tbPeek(slow(1, "")); p.Remaining != 3 || p.ResetMS != 0 {
		t.Fatalf("peek of no bucket = %+v, want full, reset 0", p)
	}
	r := e.tbTake(slow(2, ""))
	if !r.Allowed || r.Replay || r.Remaining != 1 || r.RetryAfterMS != 0 || r.ResetMS <= 3_600_000 || r.ResetMS > 7_200_000 {
		t.Fatalf("take 2 of 3 = %+v, want allowed, 1 left, full again in about 2h", r)
	}
	if p := e.pttl(k); p <= 3_600_000 || p > r.ResetMS {
		t.Fatalf("PTTL = %d, want the time until the bucket is full (%d)", p, r.ResetMS)
	}
	before := e.hash(k)
	r = e.tbTake(slow(2, ""))
	if r.Allowed || r.Remaining != 1 || r.RetryAfterMS <= 3_500_000 || r.RetryAfterMS > 3_600_000 {
		t.Fatalf("take 2 with 1 left = %+v, want denied, retry in about 1h", r)
	}
	sameHash(t, "after a denial", e.hash(k), before)
	if r := e.tbTake(slow(1, "")); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("take of the last token = %+v, want allowed, 0 left", r)
	}
	if p := e.tbPeek(slow(1, "")); p.Remaining != 0 || p.ResetMS <= 7_000_000 || p.ResetMS > 10_800_000 {
		t.Fatalf("peek of an empty bucket = %+v", p)
	}
	// A cost above the burst could never be granted: INVALID, not a denial.
	e.tbTakeErr(slow(4, ""), luascript.ErrInvalid)
}

func TestTokenBucketRefillsAtRate(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	// One token a second; the second take fails only if the machine stalls
	// for a second between the two.
	if r := e.tbTake(tb(k, 1, 2, 2, "")); !r.Allowed || r.Remaining != 0 || r.ResetMS != 2000 {
		t.Fatalf("take of the whole burst = %+v, want allowed, full again in 2000 ms", r)
	}
	r := e.tbTake(tb(k, 1, 2, 1, ""))
	if r.Allowed || r.RetryAfterMS < 1 || r.RetryAfterMS > 1000 {
		t.Fatalf("take from an empty bucket = %+v, want denied, retry within 1000 ms", r)
	}
	time.Sleep(time.Duration(r.RetryAfterMS) * time.Millisecond)
	if r := e.tbTake(tb(k, 1, 2, 1, "")); !r.Allowed {
		t.Fatalf("take after retry_after_ms = %+v, want allowed", r)
	}
	e.waitGone(k) // the key ends when the bucket is full again
	if p := e.tbPeek(tb(k, 1, 2, 1, "")); p.Remaining != 2 {
		t.Fatalf("peek after the key expired = %+v, want a full bucket", p)
	}
}

// Offered load far above the rate, for several periods, admits the burst
// plus rate * elapsed, within one token. Elapsed time is Redis's own, read
// back from the bucket (the TAT) and from TIME.
func TestTokenBucketAccuracyUnderOverload(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	// A token every 50 ms; the bucket fills from empty in 2 s, so only a
	// stall of every caller for 2 s could lose tokens.
	const rate, burst = 20, 40
	// Empty the bucket: from here on, tokens accrue from zero, and under
	// overload the bucket is never full, so none is lost.
	if r := e.tbTake(tb(k, rate, burst, burst, "")); !r.Allowed {
		t.Fatalf("first take = %+v", r)
	}
	tat, err := strconv.ParseInt(e.hash(k)["tat"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	start := tat - burst*1_000_000/rate // Redis time of the first take, µs

	var admitted, denied atomic.Int64
	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				r, err := luascript.Take(t.Context(), e.c, limits.TokenBucket, tb(k, rate, burst, 1, ""))
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					admitted.Add(1)
				} else {
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	before := e.redisTimeUS()
	left := e.tbPeek(tb(k, rate, burst, 1, "")).Remaining
	after := e.redisTimeUS()

	got := float64(burst + admitted.Load() + left)
	lo := float64(burst) + rate*float64(before-start)/1e6
	hi := float64(burst) + rate*float64(after-start)/1e6
	t.Logf("admitted %d + burst %d + %d left over %.3f s; %d denied", admitted.Load(), burst, left, float64(after-start)/1e6, denied.Load())
	if got < lo-1 || got > hi {
		t.Fatalf("admitted+left = %.0f, want burst + rate*elapsed in [%.2f, %.2f] within one token", got, lo, hi)
	}
	if denied.Load() < 5*admitted.Load() {
		t.Fatalf("only %d denied for %d admitted: the load was not well above the rate", denied.Load(), admitted.Load())
	}
}

func TestTokenBucketConcurrentTakesNeverOverAdmit(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	const n = 30
	var wg sync.WaitGroup
	var allowed atomic.Int64
	slow := tb(k, 1, 7, 1, "")
	slow.PeriodMS = 3_600_000
	slow.DedupeMS = slow.RefillMS()
	for i := range n {
		wg.Go(func() {
			a := slow
			a.RequestID = "r" + strconv.Itoa(i)
			r, err := luascript.Take(t.Context(), e.c, limits.TokenBucket, a)
			if err != nil {
				t.Error(err)
				return
			}
			if r.Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 7 {
		t.Fatalf("%d of %d takes allowed with burst 7", allowed.Load(), n)
	}
	if ids := e.hash(k)["ids"]; ids != "7" {
		t.Fatalf("ids = %q, want 7 (denied ids are not recorded)", ids)
	}
}

func TestTokenBucketReplayAndConflict(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	slow := func(cost int64, id string) luascript.Args {
		a := tb(k, 1, 5, cost, id)
		a.PeriodMS = 3_600_000
		a.DedupeMS = 60_000
		return a
	}
	e.tbTake(slow(2, "a"))
	e.tbTake(slow(1, ""))
	before := e.hash(k)
	r := e.tbTake(slow(2, "a"))
	if !r.Allowed || !r.Replay || r.Remaining != 3 {
		t.Fatalf("replay = %+v, want allowed replay with 3 left (at acceptance)", r)
	}
	sameHash(t, "after a replay", e.hash(k), before)
	e.tbTakeErr(slow(1, "a"), luascript.ErrConflict)
	sameHash(t, "after a conflict", e.hash(k), before)
	// A replay is answered even when the bucket is now empty.
	e.tbTake(slow(2, ""))
	if r := e.tbTake(slow(2, "a")); !r.Allowed || !r.Replay {
		t.Fatalf("replay on an empty bucket = %+v, want allowed replay", r)
	}
	// The key outlives the bucket's refill for the records' horizon.
	if p := e.pttl(k); p < 59_000 {
		t.Fatalf("PTTL = %d, want at least the dedupe horizon of the last record", p)
	}
}

// A request id is a replay for its dedupe horizon and new after it.
func TestTokenBucketDedupeHorizon(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	a := tb(k, 1000, 1000, 1, "a")
	a.DedupeMS = 1000
	e.tbTake(a)
	if r := e.tbTake(a); !r.Replay {
		t.Fatalf("retry within the horizon = %+v, want a replay", r)
	}
	time.Sleep(1200 * time.Millisecond)
	if r := e.tbTake(a); !r.Allowed || r.Replay {
		t.Fatalf("retry after the horizon = %+v, want a new acceptance", r)
	}
}

// Continuous traffic with fresh request ids keeps the key alive; the records
// must still stay bounded. The bucket refills slowly (1000 tokens an hour),
// so each take keeps the key alive for seconds more, while each record lives
// 20 ms. With a cap of 40 records, takes at least 2 ms apart would hit
// REQUEST_IDS_FULL after 40 takes if records were never pruned.
func TestTokenBucketPrunesRecordsUnderContinuousTraffic(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	maxLen := 0
	for i := range 300 {
		a := tb(k, 1000, 1000, 1, "id-"+strconv.Itoa(i))
		a.PeriodMS = 3_600_000
		a.DedupeMS, a.MaxRequestIDs = 20, 40
		if r := e.tbTake(a); !r.Allowed {
			t.Fatalf("take %d = %+v", i, r)
		}
		h := e.hash(k)
		records := 0
		for f := range h {
			if strings.HasPrefix(f, "r:") {
				records++
			}
		}
		if strconv.Itoa(records) != h["ids"] {
			t.Fatalf("take %d: %d records but ids = %q", i, records, h["ids"])
		}
		maxLen = max(maxLen, len(h))
		time.Sleep(2 * time.Millisecond)
	}
	// Per record: r: and q:, plus tat, rem, policy, ids, qh, qt.
	if maxLen > 2*40+6 {
		t.Fatalf("the hash grew to %d fields", maxLen)
	}
	t.Logf("largest hash: %d fields after 300 takes", maxLen)
}

func TestTokenBucketPolicy(t *testing.T) {
	e := setup(t)
	k := luascript.TokenBucketKey(e.prefix, "", "u")
	a := tb(k, 10, 10, 1, "")
	a.Strict = true
	e.tbTake(a)
	before := e.hash(k)
	other := a
	other.Burst = 11
	e.tbTakeErr(other, luascript.ErrPolicy)
	if _, err := luascript.Peek(t.Context(), e.c, limits.TokenBucket, luascript.Args{Key: k, TokenBucket: other.TokenBucket, Strict: true}); !errors.Is(err, luascript.ErrPolicy) {
		t.Fatalf("strict peek with another burst = %v, want POLICY", err)
	}
	sameHash(t, "after POLICY", e.hash(k), before)

	// A named policy's new shape applies at once.
	named := e.tbKey("v")
	e.tbTake(tb(named, 10, 10, 5, ""))
	if r := e.tbTake(tb(named, 10, 20, 5, "")); !r.Allowed || r.Remaining < 10 || r.Remaining > 11 {
		t.Fatalf("take after raising the burst to 20 = %+v, want allowed with about 10 left", r)
	}
}

func TestTokenBucketHealsKeyWithoutTTL(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	slow := tb(k, 1, 2, 2, "")
	slow.PeriodMS = 3_600_000
	slow.DedupeMS = slow.RefillMS()
	e.tbTake(slow)
	e.mustDo("PERSIST", k)
	r := e.tbTake(slow)
	if r.Allowed || !r.Healed {
		t.Fatalf("denied take on a bucket without TTL = %+v, want denied and healed", r)
	}
	if p := e.pttl(k); p <= 0 || p > 7_200_000 {
		t.Fatalf("PTTL after healing = %d", p)
	}
}

func TestTokenBucketWrongType(t *testing.T) {
	e := setup(t)
	k := e.tbKey("s")
	e.mustDo("SET", k, "v", "PX", "60000")
	e.tbTakeErr(tb(k, 1, 1, 1, ""), luascript.ErrWrongType)
	if _, err := luascript.Peek(t.Context(), e.c, limits.TokenBucket, luascript.Args{Key: k, TokenBucket: tb(k, 1, 1, 1, "").TokenBucket}); !errors.Is(err, luascript.ErrWrongType) {
		t.Fatalf("peek on a string = %v, want WRONGTYPE", err)
	}
	// A fixed window at a bucket's key is not misread as a bucket.
	h := e.tbKey("h")
	e.mustDo("HSET", h, "used", "1", "policy", "5:60000", "ids", "0")
	e.mustDo("PEXPIRE", h, "60000")
	e.tbTakeErr(tb(h, 1, 1, 1, ""), luascript.ErrWrongType)
}

func TestTokenBucketInvalidArguments(t *testing.T) {
	e := setup(t)
	k := e.tbKey("u")
	for name, a := range map[string]luascript.Args{
		"rate 0":            {Key: k, TokenBucket: luascript.TokenBucket{PeriodMS: 1000, Burst: 1}, Cost: 1, DedupeMS: 1, MaxRequestIDs: 1},
		"refill over 31 d":  {Key: k, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: luascript.MaxWindowMS, Burst: 2}, Cost: 1, DedupeMS: 1, MaxRequestIDs: 1},
		"cost above burst":  {Key: k, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: 1000, Burst: 1}, Cost: 2, DedupeMS: 1, MaxRequestIDs: 1},
		"dedupe 0":          {Key: k, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: 1000, Burst: 1}, Cost: 1, MaxRequestIDs: 1},
		"bad request id":    {Key: k, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: 1000, Burst: 1}, Cost: 1, DedupeMS: 1, MaxRequestIDs: 1, RequestID: "a:b"},
		"max request ids 0": {Key: k, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: 1000, Burst: 1}, Cost: 1, DedupeMS: 1},
	} {
		if _, err := luascript.Take(t.Context(), e.c, limits.TokenBucket, a); !errors.Is(err, luascript.ErrInvalid) {
			t.Errorf("%s: take = %v, want INVALID", name, err)
		}
	}
	// The script checks on its own too, for callers that bypass Go.
	for name, argv := range map[string][]string{
		"rate 0":           {"0", "1000", "1", "1", "1000", "10", "0", ""},
		"refill over 31 d": {"1", "2678400000", "2", "1", "1000", "10", "0", ""},
		"cost above burst": {"1", "1000", "1", "2", "1000", "10", "0", ""},
		"cost 1.5":         {"1", "1000", "2", "1.5", "1000", "10", "0", ""},
		"strict 2":         {"1", "1000", "2", "1", "1000", "10", "2", ""},
		"too few":          {"1", "1000", "2", "1", "1000", "10", "0"},
	} {
		src := luascript.ScriptText("token_bucket_take.lua")
		err := e.c.Do(t.Context(), e.c.B().Eval().Script(src).Numkeys(1).Key(k).Arg(argv...).Build()).Error()
		if err == nil || !strings.HasPrefix(err.Error(), "INVALID ") {
			t.Errorf("script with %s = %v, want INVALID", name, err)
		}
	}
	if n, _ := e.do("EXISTS", k).AsInt64(); n != 0 {
		t.Fatal("an invalid take created a key")
	}
}

// The TAT is kept exactly (whole µs plus a remainder in 1/rate µs): a token
// of 1000/7 ms is not rounded, so 7 of them last exactly one second, and so
// do a billion tokens of a bucket refilled a billion per second. Rounding
// each token up to a whole µs would report 1001 ms, and to a whole ms far
// more.
func TestTokenBucketExactArithmetic(t *testing.T) {
	e := setup(t)
	for i, tc := range []struct {
		rate, periodMS, burst, cost, reset int64
	}{
		{7, 1000, 7, 7, 1000},
		{7, 1000, 7, 1, 143}, // 142.857 ms, rounded up
		{3, 1000, 3, 3, 1000},
		{999_999_937, 1000, 999_999_937, 999_999_937, 1000}, // a prime rate
		{1_000_000_000, luascript.MaxWindowMS, 1_000_000_000, 1_000_000_000, luascript.MaxWindowMS},
		{1, luascript.MaxWindowMS, 1, 1, luascript.MaxWindowMS},
	} {
		k := e.tbKey("exact-" + strconv.Itoa(i))
		a := luascript.Args{
			Key: k, TokenBucket: luascript.TokenBucket{Rate: tc.rate, PeriodMS: tc.periodMS, Burst: tc.burst},
			Cost: tc.cost, DedupeMS: 1, MaxRequestIDs: 1,
		}
		r := e.tbTake(a)
		if !r.Allowed || r.ResetMS != tc.reset || r.Remaining != tc.burst-tc.cost {
			t.Errorf("%+v: take = %+v, want allowed, reset_ms %d, %d left", tc, r, tc.reset, tc.burst-tc.cost)
		}
		if p := e.pttl(k); p <= tc.reset-1000 || p > tc.reset {
			t.Errorf("%+v: PTTL = %d, want the time until full, %d", tc, p, tc.reset)
		}
	}
}
