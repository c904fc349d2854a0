package luascript_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
)

// bigW is the longest window: periods aligned to Redis's clock end every
// 31 days, so no test using it crosses a boundary unless it says so.
const bigW = luascript.MaxWindowMS

func (e *env) swKey(subject string) string {
	return luascript.SlidingWindowKey(e.prefix, "pol", subject)
}

func sw(key string, limit, cost int64, id string) luascript.Args {
	return luascript.Args{Key: key, Limit: limit, WindowMS: bigW, Cost: cost, RequestID: id, MaxRequestIDs: 100}
}

func (e *env) swTake(a luascript.Args) luascript.Result {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.SlidingWindow, a)
	if err != nil {
		e.t.Fatalf("sliding window take %+v: %v", a, err)
	}
	return r
}

// swTakeErr expects the take to fail with want, and the key to be as it was
// (DUMP byte for byte): a refusal writes nothing.
func (e *env) swTakeErr(a luascript.Args, want error) error {
	e.t.Helper()
	before := e.dump(a.Key)
	r, err := luascript.Take(e.t.Context(), e.c, limits.SlidingWindow, a)
	if !errors.Is(err, want) {
		e.t.Fatalf("sliding window take %+v = %+v, %v; want %v", a, r, err, want)
	}
	if after := e.dump(a.Key); after != before {
		e.t.Fatalf("take %+v refused with %v but changed the key", a, err)
	}
	return err
}

func (e *env) swPeek(key string, limit int64, strict bool) luascript.Result {
	e.t.Helper()
	r, err := luascript.Peek(e.t.Context(), e.c, limits.SlidingWindow, luascript.Args{Key: key, Limit: limit, WindowMS: bigW, Strict: strict})
	if err != nil {
		e.t.Fatalf("sliding window peek: %v", err)
	}
	return r
}

// dump is the key's content: its fields for a hash (the embedded store
// cannot DUMP one), else DUMP's bytes.
func (e *env) dump(key string) string {
	e.t.Helper()
	if typ, _ := e.do("TYPE", key).ToString(); typ == "hash" {
		return fmt.Sprint(e.hash(key))
	}
	s, err := e.do("DUMP", key).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		e.t.Fatalf("DUMP %s: %v", key, err)
	}
	return s
}

// nowMS is Redis's clock in ms, and the start of its period of bigW.
func (e *env) nowMS() (now, start int64) {
	now = e.redisTimeUS() / 1000
	return now, now - now%bigW
}

func TestSlidingWindowTakeAndDeny(t *testing.T) {
	e := setup(t)
	k := e.swKey("u")
	now, start := e.nowMS()
	r := e.swTake(sw(k, 5, 2, ""))
	if !r.Allowed || r.Replay || r.Used != 2 || r.RetryAfterMS != 0 {
		t.Fatalf("first take = %+v, want allowed, used 2", r)
	}
	// The use slides out at the end of the next period.
	if ends := start + 2*bigW - now; r.ResetMS > ends || r.ResetMS < ends-1000 {
		t.Fatalf("reset_ms = %d, want about %d", r.ResetMS, ends)
	}
	if ttl := e.pttl(k); ttl > 2*bigW || ttl < r.ResetMS-1000 {
		t.Fatalf("PTTL %d, want about reset_ms %d and at most two windows", ttl, r.ResetMS)
	}
	if r := e.swTake(sw(k, 5, 3, "")); !r.Allowed || r.Used != 5 {
		t.Fatalf("second take = %+v, want used 5", r)
	}
	before := e.dump(k)
	r = e.swTake(sw(k, 5, 1, ""))
	if r.Allowed || r.Used != 5 || r.RetryAfterMS <= 0 {
		t.Fatalf("take over the limit = %+v, want denied", r)
	}
	if e.dump(k) != before {
		t.Fatal("a denial changed the window")
	}
	// Denied until the next period, where 5 at full weight leave no room
	// for 1 of 5 until prev*(W-y)/W <= 4: y = W/5.
	now, start = e.nowMS()
	if want := start + bigW + bigW/5 - now; r.RetryAfterMS > want+1000 || r.RetryAfterMS < want-1000 {
		t.Fatalf("retry_after_ms = %d, want about %d", r.RetryAfterMS, want)
	}
	if p := e.swPeek(k, 5, true); p.Used != 5 || p.ResetMS <= bigW {
		t.Fatalf("peek = %+v, want used 5", p)
	}
	if e.dump(k) != before {
		t.Fatal("a peek changed the window")
	}
	if p := e.swPeek(e.swKey("none"), 5, true); p.Used != 0 || p.ResetMS != 0 {
		t.Fatalf("peek of no window = %+v", p)
	}
}

func TestSlidingWindowRequestIDs(t *testing.T) {
	e := setup(t)
	k := e.swKey("u")
	if r := e.swTake(sw(k, 5, 2, "a")); !r.Allowed || r.Used != 2 {
		t.Fatalf("take a = %+v", r)
	}
	e.swTake(sw(k, 5, 1, ""))
	if r := e.swTake(sw(k, 5, 2, "a")); !r.Allowed || !r.Replay || r.Used != 2 {
		t.Fatalf("replay of a = %+v, want the original used 2", r)
	}
	e.swTakeErr(sw(k, 5, 1, "a"), luascript.ErrConflict)
	if p := e.swPeek(k, 5, true); p.Used != 3 {
		t.Fatalf("used %d after a replay and a conflict, want 3", p.Used)
	}
	one := sw(k, 5, 1, "b")
	one.MaxRequestIDs = 1
	e.swTakeErr(one, luascript.ErrRequestIDsFull)
	// A replay and a take without id still work at the cap.
	one.RequestID = ""
	if r := e.swTake(one); !r.Allowed {
		t.Fatalf("take without id at the cap = %+v", r)
	}
	// A denied id is not recorded: it can be tried again.
	if r := e.swTake(sw(k, 5, 2, "c")); r.Allowed {
		t.Fatalf("take c over the limit = %+v", r)
	}
	if h := e.hash(k); h["r:c"] != "" || h["ids"] != "1" {
		t.Fatalf("hash after a denied id = %v", h)
	}
}

// Records expire when the take they record has slid out; accepted takes
// forget them, up to three each, so the cap frees up under traffic.
func TestSlidingWindowForgetsRecords(t *testing.T) {
	e := setup(t)
	k := e.swKey("u")
	_, start := e.nowMS()
	s := strconv.FormatInt(start, 10)
	e.mustDo("HSET", k, "s", s, "c", "0", "p", "0", "policy", "5:"+strconv.FormatInt(bigW, 10),
		"ids", "4", "qh", "0", "qt", "4", "q:0", "o0:1", "q:1", "o1:1", "q:2", "o2:1", "q:3", "o3:1",
		"r:o0", "1:1:1", "r:o1", "1:1:1", "r:o2", "1:1:1", "r:o3", "1:1:1")
	e.mustDo("PEXPIRE", k, "60000")
	a := sw(k, 5, 1, "new")
	a.MaxRequestIDs = 2
	if r := e.swTake(a); !r.Allowed {
		t.Fatalf("take = %+v", r)
	}
	h := e.hash(k)
	if h["ids"] != "2" || h["qh"] != "3" || h["qt"] != "5" || h["r:o0"] != "" || h["r:o2"] != "" || h["r:o3"] == "" {
		t.Fatalf("hash after forgetting = %v, want o0..o2 forgotten", h)
	}
	// An expired record of an id is a new take of it.
	if r := e.swTake(sw(k, 5, 3, "o3")); !r.Allowed || r.Replay || r.Used != 4 {
		t.Fatalf("take of an expired id = %+v, want a new take", r)
	}
}

// The previous period counts at its weight; older ones not at all.
func TestSlidingWindowPreviousPeriod(t *testing.T) {
	e := setup(t)
	policy := "10:" + strconv.FormatInt(bigW, 10)
	k, old := e.swKey("prev"), e.swKey("old")
	now, start := e.nowMS()
	e.mustDo("HSET", k, "s", strconv.FormatInt(start-bigW, 10), "c", "10", "p", "7", "policy", policy, "ids", "0", "qh", "0", "qt", "0")
	e.mustDo("HSET", old, "s", strconv.FormatInt(start-2*bigW, 10), "c", "10", "p", "7", "policy", policy, "ids", "0", "qh", "0", "qt", "0")
	e.mustDo("PEXPIRE", k, "60000")
	e.mustDo("PEXPIRE", old, "60000")
	// 10 * (W - elapsed) / W, rounded up, for the elapsed ms of now.
	share := func(now int64) int64 { return (10*(bigW-(now-start)) + bigW - 1) / bigW }
	p := e.swPeek(k, 10, true)
	if p.Used != share(now) && p.Used != share(now+1000) {
		t.Fatalf("peek = %+v, want used %d", p, share(now))
	}
	if p.ResetMS > start+bigW-now || p.ResetMS < start+bigW-now-1000 {
		t.Fatalf("reset_ms = %d, want the end of this period", p.ResetMS)
	}
	r, err := luascript.Take(t.Context(), e.c, limits.SlidingWindow, luascript.Args{Key: k, Limit: 10, WindowMS: bigW, Cost: 10 - p.Used, MaxRequestIDs: 1})
	if err != nil || !r.Allowed || r.Used != 10 {
		t.Fatalf("take of what is left = %+v, %v", r, err)
	}
	if h := e.hash(k); h["s"] != strconv.FormatInt(start, 10) || h["p"] != "10" || h["c"] != strconv.FormatInt(10-p.Used, 10) {
		t.Fatalf("hash after the period rolled = %v", h)
	}
	if r := e.swTake(sw(old, 10, 10, "")); !r.Allowed || r.Used != 10 {
		t.Fatalf("take on counts two periods old = %+v, want all 10", r)
	}
}

func TestSlidingWindowPolicyChanges(t *testing.T) {
	e := setup(t)
	k := e.swKey("u")
	e.swTake(sw(k, 5, 4, ""))
	strict := sw(k, 6, 1, "")
	strict.Strict = true
	e.swTakeErr(strict, luascript.ErrPolicy)
	if _, err := luascript.Peek(t.Context(), e.c, limits.SlidingWindow, luascript.Args{Key: k, Limit: 6, WindowMS: bigW, Strict: true}); !errors.Is(err, luascript.ErrPolicy) {
		t.Fatalf("strict peek under other limits: %v", err)
	}
	// A named policy's new limit applies at once to the counted use.
	if r := e.swTake(sw(k, 4, 1, "")); r.Allowed || r.Used != 4 {
		t.Fatalf("take under a lower limit = %+v, want denied", r)
	}
	if r := e.swTake(sw(k, 6, 2, "")); !r.Allowed || r.Used != 6 {
		t.Fatalf("take under a higher limit = %+v", r)
	}
	// A new window carries what counted at the change into the current
	// period, in full.
	a := sw(k, 10, 1, "")
	a.WindowMS = bigW - 1
	if r := e.swTake(a); !r.Allowed || r.Used != 7 {
		t.Fatalf("take under a new window = %+v, want used 7", r)
	}
	if h := e.hash(k); h["c"] != "7" || h["p"] != "0" || h["policy"] != "10:"+strconv.FormatInt(bigW-1, 10) {
		t.Fatalf("hash under the new window = %v", h)
	}
}

func TestSlidingWindowHealsAndRefuses(t *testing.T) {
	e := setup(t)
	k := e.swKey("u")
	e.swTake(sw(k, 5, 5, "a"))
	e.mustDo("PERSIST", k)
	r := e.swTake(sw(k, 5, 1, ""))
	if r.Allowed || !r.Healed {
		t.Fatalf("denied take on a window without TTL = %+v, want healed", r)
	}
	if ttl := e.pttl(k); ttl <= 0 || ttl > 2*bigW {
		t.Fatalf("PTTL after healing = %d", ttl)
	}
	e.mustDo("PERSIST", k)
	err := e.swTakeErrHealed(sw(k, 5, 2, "a"), luascript.ErrConflict)
	var le *luascript.Error
	if !errors.As(err, &le) || !le.Healed {
		t.Fatalf("conflict on a window without TTL: %v, want healed", err)
	}

	str := e.swKey("string")
	e.mustDo("SET", str, "x", "PX", "60000")
	e.swTakeErr(sw(str, 5, 1, ""), luascript.ErrWrongType)
	other := e.swKey("other")
	e.mustDo("HSET", other, "used", "1", "policy", "5:60000")
	e.mustDo("PEXPIRE", other, "60000")
	e.swTakeErr(sw(other, 5, 1, ""), luascript.ErrWrongType)
	if _, err := luascript.Peek(t.Context(), e.c, limits.SlidingWindow, luascript.Args{Key: other, Limit: 5, WindowMS: bigW}); !errors.Is(err, luascript.ErrWrongType) {
		t.Fatalf("peek of a fixed window's hash: %v", err)
	}

	// The script refuses what the Go side would, before touching Redis.
	src := luascript.ScriptText("sliding_window_take.lua")
	w := strconv.FormatInt(bigW, 10)
	for _, argv := range [][]string{
		{"0", w, "1", "10", "0", ""}, {"5", "0", "1", "10", "0", ""}, {"5", w, "6", "10", "0", ""},
		{"5", w, "1", "0", "0", ""}, {"5", w, "1", "10", "2", ""}, {"5", w, "1", "10", "0", "bad id"},
		{"5", w, "01", "10", "0", ""}, {"5", w, "1", "10", "0"},
	} {
		before := e.dump(k)
		args := append([]string{"EVAL", src, "1", k}, argv...)
		if err := e.do(args...).Error(); err == nil || err.Error()[:7] != "INVALID" {
			t.Fatalf("EVAL %v: %v, want INVALID", argv, err)
		}
		if e.dump(k) != before {
			t.Fatalf("EVAL %v changed the key", argv)
		}
	}
	if _, err := luascript.TakeCall(limits.SlidingWindow, sw(k, 5, 6, "")); !errors.Is(err, luascript.ErrInvalid) {
		t.Fatalf("cost above the limit: %v", err)
	}
}

// swTakeErrHealed expects a refusal with want after a restored TTL.
func (e *env) swTakeErrHealed(a luascript.Args, want error) error {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.SlidingWindow, a)
	if !errors.Is(err, want) {
		e.t.Fatalf("sliding window take %+v = %+v, %v; want %v", a, r, err, want)
	}
	return err
}

// The embedded store runs the sliding window too: gopher-lua compiles both
// scripts (the peek without its flags line) and computes the same answers,
// large products included.
func TestSlidingWindowOnMiniredis(t *testing.T) {
	_, c := startMiniredis(t)
	prefix := randomPrefix(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, prefix) })
	e := &env{t: t, c: c, prefix: prefix}
	k := e.swKey("u")
	if r := e.swTake(sw(k, 3, 2, "a")); !r.Allowed || r.Used != 2 || r.ResetMS <= bigW {
		t.Fatalf("take = %+v", r)
	}
	if r := e.swTake(sw(k, 3, 2, "a")); !r.Replay || r.Used != 2 {
		t.Fatalf("replay = %+v", r)
	}
	if r := e.swTake(sw(k, 3, 2, "b")); r.Allowed || r.RetryAfterMS <= 0 {
		t.Fatalf("take over the limit = %+v", r)
	}
	e.swTakeErr(sw(k, 3, 1, "a"), luascript.ErrConflict)
	if p := e.swPeek(k, 3, true); p.Used != 2 || p.ResetMS <= bigW {
		t.Fatalf("peek = %+v", p)
	}

	// The arithmetic at the bounds, against the formula.
	rng := rand.New(rand.NewPCG(1, 15))
	var cases []swCase
	for range 200 {
		k := swCase{limit: luascript.MaxLimit - rng.Int64N(1000), window: luascript.MaxWindowMS - rng.Int64N(1000), now: 1_700_000_000_000 + rng.Int64N(luascript.MaxWindowMS*4)}
		k.s = k.now - k.now%k.window - k.window*rng.Int64N(2)
		k.c, k.p, k.cost = rng.Int64N(k.limit/2), k.limit-rng.Int64N(3), 1+rng.Int64N(k.limit/2)
		cases = append(cases, k)
	}
	for i, got := range swEval(t, e, cases) {
		k := cases[i]
		if want := ceilRat(swModel(k, k.now)); got[0] != want {
			t.Fatalf("%+v: estimate %d, want %d", k, got[0], want)
		}
		if d := got[1]; !swFits(k, k.now+d) || (d > 0 && swFits(k, k.now+d-1)) {
			t.Fatalf("%+v: retry_after_ms %d is not the first ms the take fits", k, d)
		}
	}
}

// Sliding window calls share one ExecMulti with other scripts' calls, and
// each result comes back in its place.
func TestSlidingWindowInExecMulti(t *testing.T) {
	e := setup(t)
	take, err := luascript.TakeCall(limits.SlidingWindow, sw(e.swKey("m"), 2, 2, "x"))
	if err != nil {
		t.Fatal(err)
	}
	peek, err := luascript.PeekCall(limits.SlidingWindow, luascript.Args{Key: e.swKey("m"), Limit: 2, WindowMS: bigW})
	if err != nil {
		t.Fatal(err)
	}
	fixed, err := luascript.TakeCall(limits.FixedWindow, args(e.key("m"), 5, 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	res := luascript.ExecMulti(t.Context(), e.c, []luascript.Call{take, fixed, peek, take})
	if r, err := luascript.ParseTake(res[0]); err != nil || !r.Allowed || r.Used != 2 {
		t.Fatalf("sliding take = %+v, %v", r, err)
	}
	if r, err := luascript.ParseTake(res[1]); err != nil || !r.Allowed || r.Used != 1 {
		t.Fatalf("fixed window take = %+v, %v", r, err)
	}
	if r, err := luascript.ParsePeek(res[2]); err != nil || r.Used != 2 {
		t.Fatalf("sliding peek = %+v, %v", r, err)
	}
	if r, err := luascript.ParseTake(res[3]); err != nil || !r.Replay {
		t.Fatalf("sliding replay = %+v, %v", r, err)
	}
	// A reply of another shape is never read as a decision.
	for _, lua := range []string{"return {1, 0, 1, 0}", "return {1, 0, 1, 0, 5, 0}", "return {0, 0, 1, 0, 0, 0}", "return {0, 1, 1, 0, 5, 0}", "return {1, 0, -1, 0, 0, 0}"} {
		if _, err := luascript.ParseTake(e.do("EVAL", lua, "0")); !errors.Is(err, luascript.ErrMalformedReply) {
			t.Errorf("ParseSlidingWindowTake of %q = %v, want MALFORMED_REPLY", lua, err)
		}
	}
	for _, lua := range []string{"return {1}", "return {-1, 0}", "return {1, -1}"} {
		if _, err := luascript.ParsePeek(e.do("EVAL", lua, "0")); !errors.Is(err, luascript.ErrMalformedReply) {
			t.Errorf("ParseSlidingWindowPeek of %q = %v, want MALFORMED_REPLY", lua, err)
		}
	}
}

// Under maxmemory with noeviction a sliding window take's first write that
// may grow memory (its HSET) is refused before anything else is written:
// the window is as it was, replays and denials still answer, and a window
// without TTL gets it back and then decides in full.
func TestSlidingWindowOnAFullRedis(t *testing.T) {
	e := setup(t)
	e.mustDo("CONFIG", "SET", "maxmemory-policy", "noeviction")
	live, healing, fresh := e.swKey("live"), e.swKey("healing"), e.swKey("fresh")
	e.swTake(sw(live, 5, 2, "a"))
	e.swTake(sw(healing, 5, 1, ""))
	e.mustDo("PERSIST", healing)
	before := e.dump(live)
	e.mustDo("CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() {
		if err := e.c.Do(context.Background(), e.c.B().Arbitrary("CONFIG", "SET", "maxmemory", "0").Build()).Error(); err != nil {
			t.Errorf("CONFIG SET maxmemory 0: %v", err)
		}
	})
	for _, a := range []luascript.Args{sw(live, 5, 1, "b"), sw(live, 5, 1, ""), sw(fresh, 5, 1, "c")} {
		_, err := luascript.Take(t.Context(), e.c, limits.SlidingWindow, a)
		if err == nil || !strings.HasPrefix(err.Error(), "take: OOM") {
			t.Fatalf("take %+v on a full Redis: %v, want Redis's OOM refusal", a, err)
		}
	}
	if e.dump(live) != before {
		t.Fatal("a refused take changed the window")
	}
	if n, err := e.do("EXISTS", fresh).AsInt64(); err != nil || n != 0 {
		t.Fatalf("EXISTS of a refused new window = %d, %v", n, err)
	}
	if r := e.swTake(sw(live, 5, 2, "a")); !r.Replay {
		t.Fatalf("replay on a full Redis = %+v", r)
	}
	if r := e.swTake(sw(live, 5, 4, "")); r.Allowed {
		t.Fatalf("take past the limit on a full Redis = %+v, want a denial", r)
	}
	if r := e.swTake(sw(healing, 5, 1, "")); !r.Allowed || !r.Healed || r.Used != 2 {
		t.Fatalf("take on a window without TTL on a full Redis = %+v, want allowed, healed, used 2", r)
	}
}

// On Redis the peek runs as written, flags line included, so a replica may
// serve it: the script Redis cached is the flagged one.
func TestSlidingWindowPeekHasNoWritesFlag(t *testing.T) {
	e := setup(t)
	e.swPeek(e.swKey("u"), 1, false)
	src := luascript.ScriptText("sliding_window_peek.lua")
	if !strings.HasPrefix(src, "#!lua flags=no-writes\n") {
		t.Fatal("sliding_window_peek.lua does not start with the no-writes flags line")
	}
	sum := sha1.Sum([]byte(src))
	if n, err := e.do("SCRIPT", "EXISTS", hex.EncodeToString(sum[:])).AsIntSlice(); err != nil || len(n) != 1 || n[0] != 1 {
		t.Fatalf("SCRIPT EXISTS = %v, %v; want the flagged script cached", n, err)
	}
}
