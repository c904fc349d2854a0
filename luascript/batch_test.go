package luascript_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/keyslot"
	"quotad/limits"
	"quotad/luascript"
)

// viaBatch makes setup's client send every call of the package's scripts
// through ExecBatch, between two other decisions (batchingClient).
var viaBatch bool

// batched counts the calls batchingClient sent in a batch.
var batched atomic.Int64

// batchingClient sends each script call of the package's scripts as the
// middle decision of a batch of three of its own batch script, after and
// before a call of the same script without arguments (refused INVALID
// before it reads or writes anything, so under maxmemory the call's first
// write is still the batch's first), and answers its element. Every other
// command goes to Redis as it is.
type batchingClient struct{ rueidis.Client }

func (c batchingClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	call, ok := luascript.CallOfCommand(cmd.Commands())
	if !ok {
		return c.Client.Do(ctx, cmd)
	}
	// A call of the same script with no arguments, which its batch script
	// answers INVALID without a read or a write.
	decoy, _ := luascript.RawCall(luascript.CallScript(call), []string{"batch-decoy"}, nil)
	batched.Add(1)
	return luascript.ExecBatch(ctx, c.Client, []luascript.Call{decoy, call, decoy})[1]
}

// The package's tests of every script's decisions and refusals, run again
// with every script call inside a batch: a decision in a batch answers and
// writes as it does alone, whatever its neighbours.
func TestScriptTestsInsideABatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"TestRefusalsWriteNothing", TestRefusalsWriteNothing},
		{"TestCalendarRefusalsWriteNothing", TestCalendarRefusalsWriteNothing},
		{"TestFullRedisRefusesTheFirstWriteAndNothingIsHalfWritten", TestFullRedisRefusesTheFirstWriteAndNothingIsHalfWritten},
		{"TestSlidingWindowOnAFullRedis", TestSlidingWindowOnAFullRedis},
		{"TestFixedWindowLayoutAcrossReleases", TestFixedWindowLayoutAcrossReleases},
		{"TestTokenBucketLayoutAcrossReleases", TestTokenBucketLayoutAcrossReleases},
		{"TestLeaseSetLayoutAcrossReleases", TestLeaseSetLayoutAcrossReleases},
		{"TestTakeAcceptsUpToLimitAndDenialWritesNothing", TestTakeAcceptsUpToLimitAndDenialWritesNothing},
		{"TestReplayConsumesNothingAndKeepsTTL", TestReplayConsumesNothingAndKeepsTTL},
		{"TestSameRequestIDOtherCostIsConflict", TestSameRequestIDOtherCostIsConflict},
		{"TestStrictPolicyMismatch", TestStrictPolicyMismatch},
		{"TestRequestIDCap", TestRequestIDCap},
		{"TestTakeHealsWindowWithoutTTL", TestTakeHealsWindowWithoutTTL},
		{"TestTakeOnForeignKeyIsWrongType", TestTakeOnForeignKeyIsWrongType},
		{"TestScriptsRejectInvalidArguments", TestScriptsRejectInvalidArguments},
		{"TestPeek", TestPeek},
		{"TestTokenBucketBurstThenDeny", TestTokenBucketBurstThenDeny},
		{"TestTokenBucketReplayAndConflict", TestTokenBucketReplayAndConflict},
		{"TestTokenBucketPolicy", TestTokenBucketPolicy},
		{"TestTokenBucketHealsKeyWithoutTTL", TestTokenBucketHealsKeyWithoutTTL},
		{"TestTokenBucketWrongType", TestTokenBucketWrongType},
		{"TestTokenBucketInvalidArguments", TestTokenBucketInvalidArguments},
		{"TestTokenBucketExactArithmetic", TestTokenBucketExactArithmetic},
		{"TestLeasesUpToLimitRenewAndRelease", TestLeasesUpToLimitRenewAndRelease},
		{"TestLeasePolicyAndWrongType", TestLeasePolicyAndWrongType},
		{"TestSlidingWindowTakeAndDeny", TestSlidingWindowTakeAndDeny},
		{"TestSlidingWindowRequestIDs", TestSlidingWindowRequestIDs},
		{"TestSlidingWindowHealsAndRefuses", TestSlidingWindowHealsAndRefuses},
		{"TestCalendarTake", TestCalendarTake},
		{"TestCalendarPolicy", TestCalendarPolicy},
		{"TestCalendarRequestIDsFull", TestCalendarRequestIDsFull},
		{"TestCalendarHealsTTL", TestCalendarHealsTTL},
		{"TestCalendarWrongType", TestCalendarWrongType},
		{"TestCalendarInvalid", TestCalendarInvalid},
		{"TestFixedWindowSettle", TestFixedWindowSettle},
		{"TestSettleHealsAKeyWithoutTTL", TestSettleHealsAKeyWithoutTTL},
		{"TestSlidingWindowSettle", TestSlidingWindowSettle},
		{"TestTokenBucketSettle", TestTokenBucketSettle},
		{"TestCalendarSettle", TestCalendarSettle},
		{"TestSettleRefusalsWriteNothing", TestSettleRefusalsWriteNothing},
		{"TestFullRedisRefusesASettleWhole", TestFullRedisRefusesASettleWhole},
		{"TestCalendarSettleRefusalsAndHealing", TestCalendarSettleRefusalsAndHealing},
		{"TestSlidingWindowSettleNoWindowAndHealing", TestSlidingWindowSettleNoWindowAndHealing},
		{"TestTokenBucketSettlePolicyChangeAndForgetting", TestTokenBucketSettlePolicyChangeAndForgetting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			viaBatch = true
			t.Cleanup(func() { viaBatch = false })
			before := batched.Load()
			tc.test(t)
			if batched.Load() == before {
				t.Fatalf("%s sent no script call through a batch", tc.name)
			}
		})
	}
}

// raw is a call of a script with arguments as they are, past Go's
// validation.
func raw(t *testing.T, script string, keys []string, args ...string) luascript.Call {
	t.Helper()
	c, ok := luascript.RawCall(script, keys, args)
	if !ok {
		t.Fatalf("no script %s", script)
	}
	return c
}

func must(t *testing.T) func(luascript.Call, error) luascript.Call {
	return func(c luascript.Call, err error) luascript.Call {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// durations are, for each script, the elements of its reply that count ms
// from Redis's now: two Redis servers answer them a few ms apart.
var durations = map[string][]int{
	// A take's reset_ms and retry_after_ms, a peek's reset_ms.
	"fixed_window_take.lua":   {4, 5},
	"fixed_window_peek.lua":   {3},
	"token_bucket_take.lua":   {4, 5},
	"token_bucket_peek.lua":   {3},
	"concurrency_take.lua":    {4, 5},
	"concurrency_peek.lua":    {3},
	"sliding_window_take.lua": {4, 5},
	"sliding_window_peek.lua": {3},
	"calendar_take.lua":       {4, 5},
	"calendar_peek.lua":       {3},
	// A settle's reset_ms and retry_after_ms.
	"fixed_window_settle.lua":   {5, 6},
	"sliding_window_settle.lua": {5, 6},
	"calendar_settle.lua":       {5, 6},
	"token_bucket_settle.lua":   {5, 6},
}

// sameReply fails unless two replies of script are the same: the same
// integers (durations within 10 s of each other), or the same error. An
// error Redis raised (OOM, a runtime error) has the same code; the scripts'
// own error replies are the same text.
func sameReply(t *testing.T, what, script string, got, want rueidis.RedisResult) {
	t.Helper()
	gerr, werr := got.Error(), want.Error()
	if gerr != nil || werr != nil {
		if gerr == nil || werr == nil {
			t.Errorf("%s (%s): %v, %v alone", what, script, gerr, werr)
			return
		}
		g, w := gerr.Error(), werr.Error()
		if strings.HasPrefix(g, "CLOCK_SKEW ") && strings.HasPrefix(w, "CLOCK_SKEW ") {
			return // the message holds Redis's clock, a ms apart
		}
		if _, ok := rueidis.IsRedisErr(gerr); !ok {
			t.Errorf("%s (%s): %v, not a Redis error reply; alone %v", what, script, gerr, werr)
			return
		}
		if strings.Contains(w, " script: ") {
			g, _, _ = strings.Cut(g, " ")
			w, _, _ = strings.Cut(w, " ")
		}
		if g != w {
			t.Errorf("%s (%s): error %q, alone %q", what, script, gerr, werr)
		}
		return
	}
	gv, err1 := got.AsIntSlice()
	wv, err2 := want.AsIntSlice()
	if err1 != nil || err2 != nil || len(gv) != len(wv) {
		t.Errorf("%s (%s): %v (%v), alone %v (%v)", what, script, gv, err1, wv, err2)
		return
	}
	for i := range gv {
		d := gv[i] - wv[i]
		if d == 0 {
			continue
		}
		timed := false
		for _, j := range durations[script] {
			timed = timed || j == i
		}
		if !timed || d > 10_000 || d < -10_000 {
			t.Errorf("%s (%s): %v, alone %v", what, script, gv, wv)
			return
		}
	}
}

// A batch of every algorithm's and op's decisions, valid, invalid,
// conflicting, replayed, denied, over a cap, on keys of another type or
// without a TTL, answers decision by decision as the same calls sent one at
// a time to a second Redis in the same state.
func TestBatchAnswersAsEachCallAlone(t *testing.T) {
	e, lone := setup(t), setup(t)
	lone.prefix = e.prefix
	calls, keys := mixedBatch(t, e, lone)
	if err := luascript.Load(t.Context(), e.c); err != nil {
		t.Fatal(err)
	}
	// The batch holds several decisions of every batch script's: it goes
	// as one script call of each.
	of := map[string]int{}
	for _, c := range calls {
		of[luascript.BatchOf(c)]++
	}
	for name := range luascript.BatchTexts() {
		if of[name] < 2 {
			t.Errorf("the mixed batch has %d decisions of %s, want several", of[name], name)
		}
	}
	if len(of) != len(luascript.BatchTexts()) {
		t.Errorf("the mixed batch's decisions are of %d batch scripts, want %d", len(of), len(luascript.BatchTexts()))
	}
	e.mustDo("CONFIG", "RESETSTAT")
	answersAsAlone(t, e, lone, calls, keys)
	if n := scriptCalls(t, e); n != int64(len(of)) {
		t.Errorf("%d script calls for one batch, want %d: one a batch script", n, len(of))
	}
}

// The same mixed batch on a Redis Cluster, where it splits by hash slot,
// answers as the same calls sent one at a time to a standalone Redis.
func TestMixedBatchOnAClusterAnswersAsAlone(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{cl.Masters[0].Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); redistest.WaitDelayedRefreshes(t) })
	lone := setup(t)
	e := &env{t: t, c: c, prefix: lone.prefix}
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, e.prefix) })
	calls, keys := mixedBatch(t, e, lone)
	slots := map[uint16]bool{}
	for _, call := range calls {
		slots[keyslot.Of(call.Key())] = true
	}
	if len(slots) < 3 {
		t.Fatalf("the batch spans %d slots; want several", len(slots))
	}
	answersAsAlone(t, e, lone, calls, keys)
}

// mixedBatch puts the same keys of another type and without a TTL in the
// Redis of every env of seed, and returns a batch of every algorithm's
// and op's decisions on e's keys, and the keys it writes.
func mixedBatch(t *testing.T, e *env, seed ...*env) ([]luascript.Call, []string) {
	for _, x := range append([]*env{e}, seed...) {
		x.mustDo("SET", e.prefix+"str", "not ours", "PX", "600000")
		x.mustDo("HSET", e.key("nottl"), "used", "1", "policy", "3:60000", "ids", "0")
	}
	m := must(t)
	fw, str, nottl := e.key("fw"), e.prefix+"str", e.key("nottl")
	tbKey, ccKey, swKey := e.tbKey("tb"), e.ccKey("cc"), luascript.SlidingWindowKey(e.prefix, "pol", "sw")
	tbMinute, tbDeep := e.tbKey("tb-minute"), e.tbKey("tb-deep")
	hourly := luascript.TokenBucket{Rate: 1, PeriodMS: 3_600_000, Burst: 2}
	tb := func(cost int64, id string) luascript.Args {
		return luascript.Args{Key: tbKey, TokenBucket: hourly, Cost: cost, DedupeMS: 600_000, MaxRequestIDs: 10, RequestID: id}
	}
	sw := func(cost int64, id string) luascript.Args {
		return luascript.Args{Key: swKey, Limit: 3, WindowMS: limits.MaxWindowMS, Cost: cost, RequestID: id, MaxRequestIDs: 10}
	}
	month := limits.CalendarWindow{Limit: 3, Period: limits.PeriodMonth, TimeZone: "UTC", WeekStart: time.Monday}
	cal := e.cal(month, "cal", time.Now(), 2, "k")
	calPeek := luascript.Args{Key: cal.Key, Spec: cal.Spec, Limit: cal.Limit, Periods: cal.Periods}
	// One hash tag: a take of several limits is one slot's call on a Cluster.
	mfw, mtbKey := e.key("{m}fw"), e.tbKey("{m}tb")
	mtb := func(cost int64, id string) luascript.Args {
		return luascript.Args{Key: mtbKey, TokenBucket: hourly, Cost: cost, DedupeMS: 600_000, MaxRequestIDs: 10, RequestID: id}
	}
	full := args(fw, 3, 1, "c")
	full.MaxRequestIDs = 1
	strict := args(fw, 4, 1, "")
	strict.Strict = true

	calls := []luascript.Call{
		m(luascript.TakeCall(limits.FixedWindow, args(fw, 3, 2, "a"))),
		m(luascript.TakeCall(limits.FixedWindow, args(fw, 3, 2, "b"))), // denied
		m(luascript.TakeCall(limits.FixedWindow, args(fw, 3, 2, "a"))), // replay
		m(luascript.TakeCall(limits.FixedWindow, args(fw, 3, 1, "a"))), // conflict
		m(luascript.TakeCall(limits.FixedWindow, full)),                // request ids full
		m(luascript.TakeCall(limits.FixedWindow, strict)),              // policy
		raw(t, "fixed_window_take.lua", []string{fw}, "0", "60000", "1", "1", "0", ""),
		raw(t, "fixed_window_take.lua", []string{fw}, "3", "60000", "1", "1", "0"),
		m(luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: fw, Limit: 3, WindowMS: minute})),
		m(luascript.TakeCall(limits.FixedWindow, args(str, 3, 1, ""))),   // wrongtype
		m(luascript.TakeCall(limits.FixedWindow, args(nottl, 3, 1, ""))), // healed
		m(luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: str, Limit: 3, WindowMS: minute})),

		m(luascript.TakeCall(limits.TokenBucket, tb(1, "x"))),
		m(luascript.TakeCall(limits.TokenBucket, tb(1, "x"))), // replay
		m(luascript.TakeCall(limits.TokenBucket, tb(2, "x"))), // conflict
		m(luascript.TakeCall(limits.TokenBucket, tb(2, ""))),  // denied
		m(luascript.TakeCall(limits.TokenBucket, tb(1, "y"))),
		m(luascript.PeekCall(limits.TokenBucket, luascript.Args{Key: tbKey, TokenBucket: hourly})),
		m(luascript.PeekCall(limits.TokenBucket, luascript.Args{Key: tbKey, TokenBucket: luascript.TokenBucket{Rate: 2, PeriodMS: 3_600_000, Burst: 2}, Strict: true})),
		raw(t, "token_bucket_take.lua", []string{tbKey}, "1", "3600000", "2", "3", "600000", "10", "0", ""),
		raw(t, "token_bucket_take.lua", []string{str}, "1", "3600000", "2", "1", "600000", "10", "0", ""),
		// Buckets of the same rate and another period or burst, between
		// decisions on the hourly one: each decides by its own shape.
		m(luascript.TakeCall(limits.TokenBucket, luascript.Args{Key: tbMinute, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: minute, Burst: 2}, Cost: 2, DedupeMS: 600_000, MaxRequestIDs: 10})),
		m(luascript.TakeCall(limits.TokenBucket, tb(1, ""))),
		m(luascript.TakeCall(limits.TokenBucket, luascript.Args{Key: tbDeep, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: 3_600_000, Burst: 5}, Cost: 3, DedupeMS: 600_000, MaxRequestIDs: 10, RequestID: "z"})),
		m(luascript.PeekCall(limits.TokenBucket, luascript.Args{Key: tbMinute, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: minute, Burst: 2}})),

		m(luascript.TakeCall(limits.Concurrency, lease(ccKey, 1, minute, "a"))),
		m(luascript.TakeCall(limits.Concurrency, lease(ccKey, 1, minute, "b"))), // denied
		m(luascript.TakeCall(limits.Concurrency, lease(ccKey, 1, minute, "a"))), // renewed
		m(luascript.PeekCall(limits.Concurrency, luascript.Args{Key: ccKey, Limit: 1, LeaseMS: minute})),
		m(luascript.ReleaseCall(ccKey, "a")),
		m(luascript.ReleaseCall(ccKey, "a")), // nothing left
		raw(t, "concurrency_release.lua", []string{ccKey}, "a b"),
		raw(t, "concurrency_take.lua", []string{str}, "1", "60000", "0", "a"),

		m(luascript.TakeCall(limits.SlidingWindow, sw(2, "s"))),
		m(luascript.TakeCall(limits.SlidingWindow, sw(2, "s"))), // replay
		m(luascript.TakeCall(limits.SlidingWindow, sw(2, ""))),  // denied
		m(luascript.PeekCall(limits.SlidingWindow, luascript.Args{Key: swKey, Limit: 3, WindowMS: limits.MaxWindowMS})),
		raw(t, "sliding_window_take.lua", []string{swKey}, "3", "0", "1", "10", "0", ""),

		m(luascript.TakeCall(limits.Calendar, cal)),
		m(luascript.TakeCall(limits.Calendar, cal)), // replay
		m(luascript.PeekCall(limits.Calendar, calPeek)),
		raw(t, "calendar_peek.lua", luascript.CallKeys(m(luascript.PeekCall(limits.Calendar, calPeek))), append([]string{"3", "2", cal.Spec}, luascript.CallArgs(m(luascript.PeekCall(limits.Calendar, calPeek)))[3:]...)...),
		m(luascript.TakeCall(limits.Calendar, cal)),

		// Settles of the takes above: applied, replayed, conflicting, of a
		// request id never taken.
		m(luascript.SettleCall(limits.FixedWindow, luascript.Args{Key: fw, Limit: 3, WindowMS: minute, Cost: 1, RequestID: "a"})),
		m(luascript.SettleCall(limits.FixedWindow, luascript.Args{Key: fw, Limit: 3, WindowMS: minute, Cost: 1, RequestID: "a"})),
		m(luascript.SettleCall(limits.FixedWindow, luascript.Args{Key: fw, Limit: 3, WindowMS: minute, Cost: 0, RequestID: "a"})),
		m(luascript.SettleCall(limits.FixedWindow, luascript.Args{Key: fw, Limit: 3, WindowMS: minute, Cost: 1, RequestID: "never"})),
		m(luascript.SettleCall(limits.SlidingWindow, luascript.Args{Key: swKey, Limit: 3, WindowMS: limits.MaxWindowMS, Cost: 1, RequestID: "s"})),

		// Takes of several limits: accepted, replayed, denied by one check.
		takeOfChecks(t, "m1", []luascript.Call{m(luascript.TakeCall(limits.FixedWindow, args(mfw, 2, 1, "m1"))), m(luascript.TakeCall(limits.TokenBucket, mtb(1, "m1")))}),
		takeOfChecks(t, "m1", []luascript.Call{m(luascript.TakeCall(limits.FixedWindow, args(mfw, 2, 1, "m1"))), m(luascript.TakeCall(limits.TokenBucket, mtb(1, "m1")))}),
		takeOfChecks(t, "m2", []luascript.Call{m(luascript.TakeCall(limits.FixedWindow, args(mfw, 2, 1, "m2"))), m(luascript.TakeCall(limits.TokenBucket, mtb(2, "m2")))}),
	}
	return calls, []string{fw, nottl, tbKey, tbMinute, tbDeep, ccKey, swKey, mfw, mtbKey}
}

// takeOfChecks is the call of a take of several limits, the checks' calls built
// with the take's request id.
func takeOfChecks(t *testing.T, id string, checks []luascript.Call) luascript.Call {
	t.Helper()
	mc := make([]luascript.TakeCheck, len(checks))
	parts := make([]string, len(checks))
	for i, c := range checks {
		mc[i] = luascript.TakeCheck{Call: c}
		parts[i] = c.Key()
	}
	call, err := luascript.TakeChecksCall(mc, id, luascript.ChecksDigest(parts))
	if err != nil {
		t.Fatal(err)
	}
	return call
}

// answersAsAlone sends calls to e's Redis in one ExecBatch and one at a
// time to lone's, in the same state, and wants the same replies and the
// same keys.
func answersAsAlone(t *testing.T, e, lone *env, calls []luascript.Call, keys []string) {
	t.Helper()
	res := luascript.ExecBatch(t.Context(), e.c, calls)
	if len(res) != len(calls) {
		t.Fatalf("%d results for %d calls", len(res), len(calls))
	}
	for i, c := range calls {
		sameReply(t, fmt.Sprintf("call %d", i), luascript.CallScript(c), res[i], c.Exec(t.Context(), lone.c))
	}
	// The same content too, key by key.
	for _, k := range keys {
		a, b := e.hash(k), lone.hash(k)
		if len(a) != len(b) {
			t.Errorf("%s: %v, alone %v", k, a, b)
		}
		for f, v := range b {
			if strings.HasPrefix(f, "r:") || strings.HasPrefix(f, "q:") || f == "tat" {
				continue // records hold Redis's clock
			}
			if a[f] != v {
				t.Errorf("%s: %v, alone %v", k, a, b)
			}
		}
	}
}

// scriptCalls counts the script calls Redis ran, of every flavour.
func scriptCalls(t *testing.T, e *env) int64 {
	t.Helper()
	s, err := e.do("INFO", "commandstats").ToString()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, l := range strings.Split(s, "\r\n") {
		name, rest, ok := strings.Cut(l, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		c, _ := strconv.ParseInt(calls, 10, 64)
		n += c
	}
	return n
}

// After SCRIPT FLUSH (as after a restart or a failover) a batch runs once,
// with EVAL: every decision is answered, none twice.
func TestBatchAfterScriptFlushRunsEveryDecisionOnce(t *testing.T) {
	e := setup(t)
	m := must(t)
	a, b := e.key("a"), e.key("b")
	calls := []luascript.Call{
		m(luascript.TakeCall(limits.FixedWindow, args(a, 5, 1, ""))),
		m(luascript.TakeCall(limits.FixedWindow, args(a, 5, 1, "i"))),
		m(luascript.TakeCall(limits.FixedWindow, args(b, 5, 2, ""))),
		m(luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: a, Limit: 5, WindowMS: minute})),
	}
	for _, r := range luascript.ExecBatch(t.Context(), e.c, calls[:2]) {
		if _, err := luascript.ParseTake(r); err != nil {
			t.Fatal(err) // the batch script is loaded now
		}
	}
	calls[1] = m(luascript.TakeCall(limits.FixedWindow, args(a, 5, 1, "j")))
	e.mustDo("SCRIPT", "FLUSH")
	e.mustDo("CONFIG", "RESETSTAT")
	res := luascript.ExecBatch(t.Context(), e.c, calls)
	for i, want := range []int64{3, 4, 2} {
		r, err := luascript.ParseTake(res[i])
		if err != nil || !r.Allowed || r.Used != want {
			t.Errorf("take %d = %+v, %v; want allowed, used %d", i, r, err, want)
		}
	}
	if r, err := luascript.ParsePeek(res[3]); err != nil || r.Used != 4 {
		t.Errorf("peek = %+v, %v; want used 4", r, err)
	}
	if h := e.hash(a); h["used"] != "4" {
		t.Errorf("used of a = %q, want 4: a decision ran twice or not at all", h["used"])
	}
	stats, err := e.do("INFO", "commandstats").ToString()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stats, "cmdstat_evalsha:calls=1,") || !strings.Contains(stats, "cmdstat_eval:calls=1,") {
		t.Errorf("want one EVALSHA (NOSCRIPT) then one EVAL; commandstats:\n%s", stats)
	}
}

// Under maxmemory (noeviction) a batch's decisions are refused, each as its
// own OOM error, while no decision of the call has written; the first that
// writes without growing memory (a restored TTL) or a write Redis allows
// makes the later ones allowed, and each is whole: nothing is half-written.
func TestBatchOnAFullRedis(t *testing.T) {
	e := setup(t)
	m := must(t)
	e.mustDo("CONFIG", "SET", "maxmemory-policy", "noeviction")
	live, healing, fresh, after := e.key("live"), e.key("healing"), e.key("fresh"), e.key("after")
	e.take(args(live, 5, 2, "a"))
	e.take(args(healing, 5, 1, ""))
	e.mustDo("PERSIST", healing)
	before := e.hash(live)
	e.mustDo("CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() {
		if err := e.c.Do(context.Background(), e.c.B().Arbitrary("CONFIG", "SET", "maxmemory", "0").Build()).Error(); err != nil {
			t.Errorf("CONFIG SET maxmemory 0: %v", err)
		}
	})
	calls := []luascript.Call{
		m(luascript.TakeCall(limits.FixedWindow, args(live, 5, 1, "b"))),   // refused: nothing wrote yet
		m(luascript.TakeCall(limits.FixedWindow, args(fresh, 5, 1, ""))),   // refused
		m(luascript.TakeCall(limits.FixedWindow, args(live, 5, 2, "a"))),   // a replay writes nothing
		m(luascript.TakeCall(limits.FixedWindow, args(live, 5, 4, ""))),    // a denial writes nothing
		m(luascript.TakeCall(limits.FixedWindow, args(healing, 5, 1, ""))), // PEXPIRE first, then its HSET is allowed
		m(luascript.TakeCall(limits.FixedWindow, args(after, 5, 1, "z"))),  // allowed: the call has written
	}
	res := luascript.ExecBatch(t.Context(), e.c, calls)
	for i := range 2 {
		_, err := luascript.ParseTake(res[i])
		var re *rueidis.RedisError
		if !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "OOM") {
			t.Errorf("take %d on a full Redis: %v, want Redis's OOM refusal", i, err)
		}
	}
	if r, err := luascript.ParseTake(res[2]); err != nil || !r.Replay || r.Used != 2 {
		t.Errorf("replay = %+v, %v", r, err)
	}
	if r, err := luascript.ParseTake(res[3]); err != nil || r.Allowed || r.Used != 2 {
		t.Errorf("denial = %+v, %v", r, err)
	}
	if r, err := luascript.ParseTake(res[4]); err != nil || !r.Allowed || !r.Healed || r.Used != 2 {
		t.Errorf("take on a window without TTL = %+v, %v; want allowed, healed, used 2", r, err)
	}
	if r, err := luascript.ParseTake(res[5]); err != nil || !r.Allowed || r.Used != 1 {
		t.Errorf("take after a write = %+v, %v; want allowed, used 1", r, err)
	}
	sameHash(t, "live window after refused takes", e.hash(live), before)
	if n, err := e.do("EXISTS", fresh).AsInt64(); err != nil || n != 0 {
		t.Errorf("EXISTS of a refused new window = %d, %v", n, err)
	}
	if h := e.hash(after); h["used"] != "1" || h["ids"] != "1" || h["r:z"] != "1:1" || e.pttl(after) <= 0 {
		t.Errorf("window written after the first write = %v, PTTL %d; want whole", h, e.pttl(after))
	}
}

// evalBatch EVALs a batch script of src with keys, the layout of three
// bytes a decision, no references, and the decisions' arguments.
func evalBatch(e *env, src string, keys []string, layout []byte, argv ...string) rueidis.RedisResult {
	e.t.Helper()
	return evalRefs(e, src, keys, layout, "", argv...)
}

// evalRefs is evalBatch with the references refs.
func evalRefs(e *env, src string, keys []string, layout []byte, refs string, argv ...string) rueidis.RedisResult {
	e.t.Helper()
	cmd := append([]string{"EVAL", src, strconv.Itoa(len(keys))}, keys...)
	return e.do(append(append(cmd, string(layout), refs), argv...)...)
}

// The batch script refuses a layout that does not add up before running
// any decision.
func TestBatchRefusesAMalformedLayout(t *testing.T) {
	e := setup(t)
	k := e.key("k")
	take := []string{"100", "60000", "1", "1", "0", ""}
	const fw = 1 // fixed_window_take.lua, first in its batch script
	fwBatch := luascript.BatchTexts()["batch_fixed_window.lua"]
	for name, tc := range map[string]struct {
		keys   []string
		layout []byte
		argv   []string
	}{
		"no decision":                          {nil, nil, nil},
		"a layout of 2 bytes":                  {[]string{k}, []byte{fw, 1}, take},
		"body 0":                               {[]string{k}, []byte{0, 1, 6}, take},
		"unknown body":                         {[]string{k}, []byte{99, 1, 6}, take},
		"keys left over":                       {[]string{k, k}, []byte{fw, 1, 6}, take},
		"keys missing":                         {nil, []byte{fw, 1, 6}, take},
		"arguments missing":                    {[]string{k}, []byte{fw, 1, 7}, take},
		"arguments over":                       {[]string{k}, []byte{fw, 1, 6}, append(take, "x")},
		"a valid decision, then one malformed": {[]string{k, k}, []byte{fw, 1, 6, fw, 1, 7}, append(take, take...)},
	} {
		err := evalBatch(e, fwBatch, tc.keys, tc.layout, tc.argv...).Error()
		if err == nil || !strings.HasPrefix(err.Error(), "INVALID batch") {
			t.Errorf("%s: %v, want INVALID batch", name, err)
		}
	}
	// References that do not add up.
	for name, tc := range map[string]struct {
		layout []byte
		refs   string
	}{
		"a reference missing":         {[]byte{fw, 1, 6}, "\x01\x02\x03\x04\x05"},
		"a reference over":            {[]byte{fw, 1, 6}, "\x01\x02\x03\x04\x05\x06\x01"},
		"a reference to no argument":  {[]byte{fw, 1, 6}, "\x01\x02\x03\x04\x05\x07"},
		"a reference to the layout":   {[]byte{fw, 1, 6}, "\x01\x02\x03\x04\x05\x00"},
		"the second decision's wrong": {[]byte{fw, 1, 6, fw, 1, 6}, "\x01\x02\x03\x04\x05\x06\x01\x02\x03\x04\x05\x09"},
	} {
		keys := []string{k, k}[:len(tc.layout)/3]
		err := evalRefs(e, fwBatch, keys, tc.layout, tc.refs, take...).Error()
		if err == nil || !strings.HasPrefix(err.Error(), "INVALID batch") {
			t.Errorf("%s: %v, want INVALID batch", name, err)
		}
	}
	// Every batch script knows its own bodies only.
	for name, src := range luascript.BatchTexts() {
		n := luascript.BatchBodies(name)
		for _, b := range []byte{0, byte(n + 1)} {
			err := evalBatch(e, src, []string{k}, []byte{b, 1, 6}, take...).Error()
			if err == nil || !strings.HasPrefix(err.Error(), "INVALID batch") {
				t.Errorf("%s, body %d of %d: %v, want INVALID batch", name, b, n, err)
			}
		}
	}
	if n, err := e.do("EXISTS", k).AsInt64(); err != nil || n != 0 {
		t.Errorf("a refused batch wrote: EXISTS %d, %v", n, err)
	}
	// Two decisions that share their arguments, sent once.
	res, err := evalRefs(e, fwBatch, []string{k, k}, []byte{fw, 1, 6, fw, 1, 6},
		"\x01\x02\x03\x04\x05\x06\x01\x02\x03\x04\x05\x06", take...).ToArray()
	if err != nil || len(res) != 2 {
		t.Fatalf("two decisions by reference: %v, %v", res, err)
	}
	if h := e.hash(k); h["used"] != "2" {
		t.Errorf("used after two takes by reference = %q", h["used"])
	}
	e.do("DEL", k)
	// No layout at all.
	if err := e.do("EVAL", fwBatch, "0").Error(); err == nil || !strings.HasPrefix(err.Error(), "INVALID batch") {
		t.Errorf("no arguments: %v, want INVALID batch", err)
	}
	// More decisions than a call may carry.
	var keys, argv []string
	var layout []byte
	for range luascript.MaxBatch + 1 {
		keys = append(keys, k)
		layout = append(layout, fw, 1, 6)
		argv = append(argv, take...)
	}
	if err := evalBatch(e, fwBatch, keys, layout, argv...).Error(); err == nil || !strings.HasPrefix(err.Error(), "INVALID batch") {
		t.Errorf("%d decisions: %v, want INVALID batch", len(keys), err)
	}
	// The most it may carry are decided.
	res, err = evalBatch(e, fwBatch, keys[1:], layout[3:], argv[6:]...).ToArray()
	if err != nil || len(res) != luascript.MaxBatch {
		t.Fatalf("%d decisions: %d replies, %v", luascript.MaxBatch, len(res), err)
	}
	if h := e.hash(k); h["used"] != strconv.Itoa(luascript.MaxBatch) {
		t.Errorf("used after %d takes = %q", luascript.MaxBatch, h["used"])
	}
}

// A Lua runtime error in one decision, or an error Redis raises in its
// redis.call, is that decision's error element; the decisions before and
// after it are answered and applied.
func TestBatchErrorInOneBodyIsThatDecisionsOwn(t *testing.T) {
	e := setup(t)
	a := e.key("a")
	take := []string{"10", "60000", "1", "1", "0", ""}
	for _, tc := range []struct{ body, want string }{
		{"local x = nil\nreturn x.y", "ERR "},
		{"return redis.call('INCR', KEYS[1])", "WRONGTYPE "},
		{"error('boom')", "ERR "},
	} {
		src, idx := luascript.BatchTextWith(tc.body)
		res, err := evalBatch(e, src, []string{a, a, a}, []byte{1, 1, 6, idx, 1, 0, 1, 1, 6}, append(take, take...)...).ToArray()
		if err != nil || len(res) != 3 {
			t.Fatalf("batch with %q: %v, %v", tc.body, res, err)
		}
		if err := res[1].Error(); err == nil || !strings.HasPrefix("ERR "+err.Error(), tc.want) && !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("element of %q = %v, want an error starting %q", tc.body, err, tc.want)
		}
		for _, i := range []int{0, 2} {
			if v, err := res[i].AsIntSlice(); err != nil || v[0] != 1 {
				t.Errorf("element %d beside %q = %v, %v; want an allowed take", i, tc.body, v, err)
			}
		}
	}
	if h := e.hash(a); h["used"] != "6" {
		t.Errorf("used = %q, want 6: the takes beside a failing body were not all applied", h["used"])
	}
}

// keyslot.Of is Redis's own CLUSTER KEYSLOT, and a Cluster batch goes as one
// script call per hash slot, each to its slot's node, answering every
// decision as alone.
func TestBatchOnAClusterSplitsBySlot(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	node := cl.Masters[0]
	for _, k := range []string{"", "a", "{a}", "{a}b", "x{a}y", "{}a", "a{}", "{{a}}", "a{b}{c}", "{", "}", "q:{user-42}:w", "é{ü}"} {
		want, err := node.Do(t, "CLUSTER", "KEYSLOT", k).AsInt64()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := keyslot.Of(k); int64(got) != want {
			t.Errorf("keyslot.Of(%q) = %d, CLUSTER KEYSLOT %d", k, got, want)
		}
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{node.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); redistest.WaitDelayedRefreshes(t) })
	if c.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode %s", c.Mode())
	}
	prefix := randomPrefix(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, prefix) })
	m := must(t)
	var calls []luascript.Call
	slots := map[uint16]int{}
	for i := range 40 {
		// Eight subjects, five decisions each, interleaved.
		k := luascript.FixedWindowKey(prefix, "pol", "s"+strconv.Itoa(i%8))
		slots[keyslot.Of(k)]++
		calls = append(calls, m(luascript.TakeCall(limits.FixedWindow, args(k, 3, 1, ""))))
	}
	for _, n := range cl.Masters {
		if err := n.Do(t, "CONFIG", "RESETSTAT").Error(); err != nil {
			t.Fatal(err)
		}
	}
	res := luascript.ExecBatch(t.Context(), c, calls)
	seen := map[string]int{}
	for i, r := range res {
		got, err := luascript.ParseTake(r)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		// Each subject's takes run in order: 1, 2, 3 allowed, then denied.
		k := calls[i].Key()
		seen[k]++
		if want := seen[k] <= 3; got.Allowed != want || got.Used != int64(min(seen[k], 3)) {
			t.Errorf("take %d of %s = %+v", seen[k], k, got)
		}
	}
	var evals int64
	for _, n := range cl.Masters {
		for _, name := range []string{"evalsha", "eval"} {
			if v := n.InfoField(t, "commandstats", "cmdstat_"+name); v != "" {
				calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
				c, _ := strconv.ParseInt(calls, 10, 64)
				evals += c
			}
		}
	}
	// One EVALSHA per slot, and one EVAL more for each node that did not
	// hold the batch script yet.
	if evals < int64(len(slots)) || evals > int64(2*len(slots)) {
		t.Errorf("%d script calls for %d slots", evals, len(slots))
	}
	// Again, now that every node holds it: one call per slot exactly.
	for _, n := range cl.Masters {
		if err := n.Do(t, "CONFIG", "RESETSTAT").Error(); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range luascript.ExecBatch(t.Context(), c, calls) {
		if _, err := luascript.ParseTake(r); err != nil {
			t.Fatal(err)
		}
	}
	evals = 0
	for _, n := range cl.Masters {
		if v := n.InfoField(t, "commandstats", "cmdstat_evalsha"); v != "" {
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			c, _ := strconv.ParseInt(calls, 10, 64)
			evals += c
		}
	}
	if evals != int64(len(slots)) {
		t.Errorf("%d EVALSHA calls for %d slots", evals, len(slots))
	}
}

// The embedded store runs the batch script too (gopher-lua), with the same
// answers as the lone scripts.
func TestBatchOnMiniredis(t *testing.T) {
	_, c := startMiniredis(t)
	prefix := randomPrefix(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, prefix) })
	e := &env{t: t, c: c, prefix: prefix}
	m := must(t)
	k := e.key("u")
	calls := []luascript.Call{
		m(luascript.TakeCall(limits.FixedWindow, args(k, 3, 2, "a"))),
		m(luascript.TakeCall(limits.FixedWindow, args(k, 3, 2, "a"))),
		m(luascript.TakeCall(limits.FixedWindow, args(k, 3, 2, "b"))),
		m(luascript.TakeCall(limits.FixedWindow, args(k, 3, 1, "a"))),
		m(luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: k, Limit: 3, WindowMS: minute})),
		raw(t, "fixed_window_take.lua", []string{k}, "0", "60000", "1", "1", "0", ""),
	}
	res := luascript.ExecBatch(t.Context(), c, calls)
	if r, err := luascript.ParseTake(res[0]); err != nil || !r.Allowed || r.Used != 2 {
		t.Errorf("take = %+v, %v", r, err)
	}
	if r, err := luascript.ParseTake(res[1]); err != nil || !r.Replay {
		t.Errorf("replay = %+v, %v", r, err)
	}
	if r, err := luascript.ParseTake(res[2]); err != nil || r.Allowed {
		t.Errorf("denial = %+v, %v", r, err)
	}
	if _, err := luascript.ParseTake(res[3]); !errors.Is(err, luascript.ErrConflict) {
		t.Errorf("conflict = %v", err)
	}
	if r, err := luascript.ParsePeek(res[4]); err != nil || r.Used != 2 {
		t.Errorf("peek = %+v, %v", r, err)
	}
	if _, err := luascript.ParseTake(res[5]); !errors.Is(err, luascript.ErrInvalid) {
		t.Errorf("invalid = %v", err)
	}
}

// BenchmarkBatch measures the CPU time redis-server spends per decision
// (INFO cpu), and this process (the client: building the calls, rueidis,
// the parsers' input), on each algorithm's take, with a fresh request id each over
// 10,000 subjects, sent three ways: lone script calls 16 in one pipeline
// (ExecMulti), and batch script calls of 16 and of 64 decisions
// (ExecBatch). The three take turns, 960 decisions at a time, so that a
// machine busy with other work slows each alike, and the keys hold as many
// records for each.
//
//	go test -run '^$' -bench BenchmarkBatch -benchtime 60000x -count 3 ./luascript/
func BenchmarkBatch(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	prefix := randomPrefix(b)
	b.Cleanup(func() { redistest.AssertAllKeysHaveTTL(b, c, prefix) })
	const subjects = 10_000
	month := limits.CalendarWindow{Limit: luascript.MaxLimit, Period: limits.PeriodMonth, TimeZone: "UTC"}
	periods := luascript.CalendarAround(month, 0, time.Now())
	bucket := luascript.TokenBucket{Rate: luascript.MaxLimit, PeriodMS: 60_000, Burst: luascript.MaxLimit}
	algorithms := []struct {
		name string
		call func(subject, id string) (luascript.Call, error)
	}{
		{"fixed_window", func(s, id string) (luascript.Call, error) {
			return luascript.TakeCall(limits.FixedWindow, luascript.Args{Key: luascript.FixedWindowKey(prefix, "", s), Limit: luascript.MaxLimit, WindowMS: 60_000, Cost: 1, MaxRequestIDs: luascript.MaxRequestIDsSize, RequestID: id})
		}},
		{"fixed_window_no_id", func(s, _ string) (luascript.Call, error) {
			return luascript.TakeCall(limits.FixedWindow, luascript.Args{Key: luascript.FixedWindowKey(prefix, "", s), Limit: luascript.MaxLimit, WindowMS: 60_000, Cost: 1, MaxRequestIDs: luascript.MaxRequestIDsSize})
		}},
		{"token_bucket", func(s, id string) (luascript.Call, error) {
			return luascript.TakeCall(limits.TokenBucket, luascript.Args{Key: luascript.TokenBucketKey(prefix, "", s), TokenBucket: bucket, Cost: 1, DedupeMS: 60_000, MaxRequestIDs: luascript.MaxRequestIDsSize, RequestID: id})
		}},
		{"sliding_window", func(s, id string) (luascript.Call, error) {
			return luascript.TakeCall(limits.SlidingWindow, luascript.Args{Key: luascript.SlidingWindowKey(prefix, "", s), Limit: luascript.MaxLimit, WindowMS: 60_000, Cost: 1, MaxRequestIDs: luascript.MaxRequestIDsSize, RequestID: id})
		}},
		{"concurrency", func(s, id string) (luascript.Call, error) {
			return luascript.TakeCall(limits.Concurrency, luascript.Args{Key: luascript.ConcurrencyKey(prefix, "", s), Limit: luascript.MaxLeases, LeaseMS: 60_000, RequestID: id})
		}},
		{"calendar", func(s, id string) (luascript.Call, error) {
			return luascript.TakeCall(limits.Calendar, luascript.Args{Key: luascript.CalendarKey(prefix, "", s), Spec: month.Spec(), Limit: month.Limit, Periods: periods, Cost: 1, MaxRequestIDs: luascript.MaxRequestIDsSize, RequestID: id})
		}},
	}
	modes := []struct {
		name  string
		n     int
		batch bool
	}{{"alone16", 16, false}, {"batch16", 16, true}, {"batch64", 64, true}}
	const turn = 960
	for _, alg := range algorithms {
		b.Run(alg.name, func(b *testing.B) {
			if err := c.Do(b.Context(), c.B().Flushall().Build()).Error(); err != nil {
				b.Fatal(err)
			}
			if err := luascript.Load(b.Context(), c); err != nil {
				b.Fatal(err)
			}
			cpu := make([]float64, len(modes))
			decisions := make([]int, len(modes))
			calls := make([]luascript.Call, 0, 64)
			rng, seq, mode := uint64(1), 0, 0
			flush := func() {
				var res []rueidis.RedisResult
				if modes[mode].batch {
					res = luascript.ExecBatch(b.Context(), c, calls)
				} else {
					res = luascript.ExecMulti(b.Context(), c, calls)
				}
				for _, r := range res {
					if err := r.Error(); err != nil {
						b.Fatal(err)
					}
				}
				decisions[mode] += len(calls)
				calls = calls[:0]
			}
			own := make([]float64, len(modes))
			cpu0, own0 := redisCPU(b, c), ownCPU(b)
			for b.Loop() {
				rng = rng*6364136223846793005 + 1442695040888963407
				seq++
				call, err := alg.call("s"+strconv.FormatUint(rng>>33%subjects, 10), "r"+strconv.Itoa(seq))
				if err != nil {
					b.Fatal(err)
				}
				if calls = append(calls, call); len(calls) == modes[mode].n {
					flush()
				}
				if seq%turn == 0 {
					if len(calls) > 0 {
						flush()
					}
					own1 := ownCPU(b)
					cpu1 := redisCPU(b, c)
					cpu[mode] += cpu1 - cpu0
					own[mode] += own1 - own0
					cpu0, own0, mode = cpu1, ownCPU(b), (mode+1)%len(modes)
				}
			}
			if len(calls) > 0 {
				flush()
			}
			own[mode] += ownCPU(b) - own0
			cpu[mode] += redisCPU(b, c) - cpu0
			for i, m := range modes {
				if decisions[i] > 0 {
					b.ReportMetric(cpu[i]*1e6/float64(decisions[i]), m.name+"-µs/dec")
					b.ReportMetric(own[i]*1e6/float64(decisions[i]), m.name+"-client-µs/dec")
				}
			}
		})
	}
}

// fastCheck starts the check of all of a script's arguments at once,
// which the checks one by one back up (contract.go), and fastOff turns it
// off: a condition that always fails.
const (
	fastCheck = "-- Every argument at once, else one by one:\nif not ("
	fastOff   = "-- Every argument at once, else one by one:\nif true or not ("
)

// argVariants are what each argument of a take is tried as: canonical
// decimals at and past their bounds, and every form tonumber or a loose
// pattern would take.
var argVariants = []string{
	"", "0", "1", "2", "4", "5", "6", "01", "10", "-1", "+1", " 1", "1 ", "1.0", "1e3", "0x10", "1:2", "inf", "nan",
	"10000", "100000", "1000000", "1000001", "2678400000", "2678400001", "9007199254740991", "9007199254740993",
	"99999999999999999999", "a", "a-b_C9", "a b", "a:b", "é", strings.Repeat("x", 64), strings.Repeat("x", 65),
}

// The check of all arguments at once accepts and refuses exactly what the
// checks one by one do, with the same replies: each script is run as it is
// and with the one-match check never matching, on every variant of every
// argument.
func TestFastArgumentChecksAgreeWithTheSlowOnes(t *testing.T) {
	e := setup(t)
	bases := map[string][][]string{
		"fixed_window_take.lua":   {{"5", "60000", "1", "10", "0", "id"}},
		"sliding_window_take.lua": {{"5", "60000", "1", "10", "0", "id"}},
		// The second bucket refills in exactly the longest time allowed.
		"token_bucket_take.lua": {{"5", "1000", "5", "5", "1000", "10", "0", "id"}, {"5", "2678400000", "5", "1", "1000", "10", "1", ""}},
		"concurrency_take.lua":  {{"5", "60000", "0", "id"}},
		// Periods of an hour around now; a variant of an edge may leave
		// Redis's clock out of them (CLOCK_SKEW).
		"calendar_take.lua": {append([]string{"5", "1", "10", "0", "id", "5:hour:UTC:monday:0"}, hourEdges()...)},
	}
	for script := range bases {
		src := luascript.ScriptText(script)
		if strings.Count(src, fastCheck) != 1 {
			t.Fatalf("%s: the check of every argument at once is not in the script once", script)
		}
		slow := strings.Replace(src, fastCheck, fastOff, 1)
		n := 0
		for _, base := range bases[script] {
			for i := range base {
				for _, v := range argVariants {
					argv := append([]string(nil), base...)
					argv[i] = v
					n++
					keys := func(side string) []string {
						k := e.prefix + "{" + side + ":" + strconv.Itoa(n) + "}"
						if strings.HasPrefix(script, "calendar_") {
							return []string{"3", k + ":1", k + ":2", k + ":3"}
						}
						return []string{"1", k}
					}
					fast := e.do(append(append([]string{"EVAL", src}, keys("fast")...), argv...)...)
					want := e.do(append(append([]string{"EVAL", slow}, keys("slow")...), argv...)...)
					sameReply(t, fmt.Sprintf("%s %q", script, argv), script, fast, want)
				}
			}
		}
	}
}

// The embedded store runs the mixed batch too (gopher-lua), with the
// answers its lone scripts give.
func TestMixedBatchOnMiniredisAnswersAsAlone(t *testing.T) {
	_, c := startMiniredis(t)
	_, lc := startMiniredis(t)
	prefix := randomPrefix(t)
	e, lone := &env{t: t, c: c, prefix: prefix}, &env{t: t, c: lc, prefix: prefix}
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, prefix) })
	calls, keys := mixedBatch(t, e, lone)
	answersAsAlone(t, e, lone, calls, keys)
}

// ownCPU is the CPU time this process has used, in seconds.
func ownCPU(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// hourEdges are the edges of three periods of an hour around now, ms.
func hourEdges() []string {
	now := time.Now().UnixMilli()
	start := now - now%3_600_000
	var edges []string
	for i := -1; i <= 2; i++ {
		edges = append(edges, strconv.FormatInt(start+int64(i)*3_600_000, 10))
	}
	return edges
}
