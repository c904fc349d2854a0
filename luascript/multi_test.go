package luascript_test

import (
	"errors"
	"testing"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
)

// ExecMulti answers each call as Exec would, in order, and a script Redis
// no longer holds (SCRIPT FLUSH) is run anyway, once.
func TestExecMultiMatchesExec(t *testing.T) {
	for _, flush := range []bool{false, true} {
		t.Run(map[bool]string{false: "cached", true: "after-script-flush"}[flush], func(t *testing.T) {
			e := setup(t)
			a, b := e.key("a"), e.key("b")
			if flush {
				e.mustDo("SCRIPT", "FLUSH")
			}
			var calls []luascript.Call
			add := func(c luascript.Call, err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				calls = append(calls, c)
			}
			add(luascript.TakeCall(limits.FixedWindow, args(a, 3, 2, "")))
			add(luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: a, Limit: 3, WindowMS: minute}))
			add(luascript.TakeCall(limits.FixedWindow, args(a, 3, 2, "")))     // denied: 2+2 > 3
			add(luascript.TakeCall(limits.FixedWindow, args(b, 3, 1, "id-1"))) // another key
			add(luascript.TakeCall(limits.FixedWindow, args(b, 3, 1, "id-1"))) // its replay
			add(luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: e.key("none"), Limit: 3, WindowMS: minute}))

			res := luascript.ExecMulti(t.Context(), e.c, calls)
			if len(res) != len(calls) {
				t.Fatalf("%d results for %d calls", len(res), len(calls))
			}
			take := func(i int) luascript.Result {
				t.Helper()
				r, err := luascript.ParseTake(res[i])
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				return r
			}
			peek := func(i int) luascript.Result {
				t.Helper()
				r, err := luascript.ParsePeek(res[i])
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				return r
			}
			if r := take(0); !r.Allowed || r.Used != 2 {
				t.Errorf("take 0 = %+v, want allowed, used 2", r)
			}
			if r := peek(1); !r.Exists || r.Used != 2 {
				t.Errorf("peek 1 = %+v, want used 2", r)
			}
			if r := take(2); r.Allowed || r.Used != 2 {
				t.Errorf("take 2 = %+v, want denied, used 2", r)
			}
			if r := take(3); !r.Allowed || r.Replay || r.Used != 1 {
				t.Errorf("take 3 = %+v, want allowed, used 1", r)
			}
			if r := take(4); !r.Allowed || !r.Replay || r.Used != 1 {
				t.Errorf("take 4 = %+v, want a replay, used 1", r)
			}
			if r := peek(5); r.Exists || r.Used != 0 {
				t.Errorf("peek 5 = %+v, want no window", r)
			}
			// Each take ran once: a NOSCRIPT fallback that ran a take twice
			// would show here.
			if h := e.hash(a); h["used"] != "2" {
				t.Errorf("used of a = %q, want 2", h["used"])
			}
			if h := e.hash(b); h["used"] != "1" {
				t.Errorf("used of b = %q, want 1", h["used"])
			}
		})
	}
}

// A call that fails validation is never built, as FixedWindowTake refuses
// it before Redis.
func TestCallValidates(t *testing.T) {
	if _, err := luascript.TakeCall(limits.FixedWindow, args("k", 3, 4, "")); err == nil {
		t.Error("TakeCall with cost above the limit: no error")
	}
	if _, err := luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: "", Limit: 3, WindowMS: minute}); err == nil {
		t.Error("PeekCall without a key: no error")
	}
	bucket := tb("k", 1, 3, 4, "")
	for name, err := range map[string]error{
		"TokenBucketTakeCall, cost above the burst":  second(luascript.TakeCall(limits.TokenBucket, bucket)),
		"TokenBucketPeekCall, rate 0":                second(luascript.PeekCall(limits.TokenBucket, luascript.Args{Key: "k", TokenBucket: luascript.TokenBucket{PeriodMS: 1, Burst: 1}})),
		"ConcurrencyTakeCall without a request id":   second(luascript.TakeCall(limits.Concurrency, lease("k", 1, minute, ""))),
		"ConcurrencyPeekCall, limit above MaxLeases": second(luascript.PeekCall(limits.Concurrency, luascript.Args{Key: "k", Limit: luascript.MaxLeases + 1, LeaseMS: 1})),
		"ConcurrencyReleaseCall, bad request id":     second(luascript.ReleaseCall("k", "a b")),
	} {
		if !errors.Is(err, luascript.ErrInvalid) {
			t.Errorf("%s: %v, want INVALID", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// ExecMulti takes calls of every script in one batch, in any order, and
// each result reads as that call's one-shot function would answer: after a
// SCRIPT FLUSH and on the embedded store (flags line refused, so every peek
// falls back) as well. Errors stay with their own call.
func TestExecMultiMixesAlgorithms(t *testing.T) {
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
			fw, bucket, leases := e.key("fw"), e.tbKey("tb"), e.ccKey("cc")
			slow := tb(bucket, 1, 3, 2, "t-1")
			slow.PeriodMS = 3_600_000
			slow.DedupeMS = slow.RefillMS()
			shape := lease(leases, 1, minute, "")

			var calls []luascript.Call
			add := func(c luascript.Call, err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				calls = append(calls, c)
			}
			add(luascript.TakeCall(limits.TokenBucket, slow))                                                       // 0: allowed, 1 left
			add(luascript.TakeCall(limits.Concurrency, lease(leases, 1, minute, "job-a")))                          // 1: allowed
			add(luascript.TakeCall(limits.FixedWindow, args(fw, 3, 2, "")))                                         // 2: allowed, used 2
			add(luascript.TakeCall(limits.Concurrency, lease(leases, 1, minute, "job-b")))                          // 3: denied
			add(luascript.PeekCall(limits.TokenBucket, luascript.Args{Key: bucket, TokenBucket: slow.TokenBucket})) // 4: 1 left
			add(luascript.PeekCall(limits.Concurrency, shape))                                                      // 5: 1 held
			add(luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: fw, Limit: 3, WindowMS: minute}))        // 6: used 2
			add(luascript.TakeCall(limits.TokenBucket, slow))                                                       // 7: replay of 0
			other := slow
			other.Cost = 1
			add(luascript.TakeCall(limits.TokenBucket, other))                         // 8: CONFLICT, same id, other cost
			add(luascript.TakeCall(limits.Concurrency, lease(fw, 1, minute, "job-c"))) // 9: WRONGTYPE, a window
			add(luascript.ReleaseCall(leases, "job-a"))                                // 10: released
			add(luascript.ReleaseCall(leases, "job-a"))                                // 11: nothing left to release
			add(luascript.TakeCall(limits.FixedWindow, args(fw, 3, 2, "")))            // 12: denied
			if got := calls[0].Key(); got != bucket {
				t.Errorf("Key() = %q, want %q", got, bucket)
			}

			res := luascript.ExecMulti(t.Context(), e.c, calls)
			if len(res) != len(calls) {
				t.Fatalf("%d results for %d calls", len(res), len(calls))
			}
			want(t, 0, luascript.ParseTake, res[0], func(r luascript.Result) bool { return r.Allowed && !r.Replay && r.Remaining == 1 })
			want(t, 1, luascript.ParseTake, res[1], func(r luascript.Result) bool { return r.Allowed && r.Used == 1 })
			want(t, 2, luascript.ParseTake, res[2], func(r luascript.Result) bool { return r.Allowed && r.Used == 2 })
			want(t, 3, luascript.ParseTake, res[3], func(r luascript.Result) bool { return !r.Allowed && r.Used == 1 && r.RetryAfterMS > 0 })
			want(t, 4, luascript.ParsePeek, res[4], func(r luascript.Result) bool { return r.Remaining == 1 && r.ResetMS > 0 })
			want(t, 5, luascript.ParsePeek, res[5], func(r luascript.Result) bool { return r.Used == 1 && r.ResetMS > 0 })
			want(t, 6, luascript.ParsePeek, res[6], func(r luascript.Result) bool { return r.Exists && r.Used == 2 })
			want(t, 7, luascript.ParseTake, res[7], func(r luascript.Result) bool { return r.Allowed && r.Replay && r.Remaining == 1 })
			if r, err := luascript.ParseTake(res[8]); !errors.Is(err, luascript.ErrConflict) {
				t.Errorf("call 8 = %+v, %v; want CONFLICT", r, err)
			}
			if r, err := luascript.ParseTake(res[9]); !errors.Is(err, luascript.ErrWrongType) {
				t.Errorf("call 9 = %+v, %v; want WRONGTYPE", r, err)
			}
			want(t, 10, luascript.ParseRelease, res[10], func(r luascript.Result) bool { return r.Released && r.Used == 0 })
			want(t, 11, luascript.ParseRelease, res[11], func(r luascript.Result) bool { return !r.Released && r.Used == 0 })
			want(t, 12, luascript.ParseTake, res[12], func(r luascript.Result) bool { return !r.Allowed && r.Used == 2 })
			// Each take ran once: a fallback that ran one twice would show.
			if h := e.hash(fw); h["used"] != "2" {
				t.Errorf("used of the window = %q, want 2", h["used"])
			}
			if r := e.tbPeek(slow); r.Remaining != 1 {
				t.Errorf("bucket after the batch = %+v, want 1 left", r)
			}
			if n := e.pttl(leases); n != -2 {
				t.Errorf("lease set after its last release: PTTL %d, want gone", n)
			}
		})
	}
}

// want parses result i of a batch and checks it with ok.
func want[T any](t *testing.T, i int, parse func(rueidis.RedisResult) (T, error), res rueidis.RedisResult, ok func(T) bool) {
	t.Helper()
	r, err := parse(res)
	if err != nil || !ok(r) {
		t.Errorf("call %d = %+v, %v", i, r, err)
	}
}

// A zero Call is refused without reaching Redis, alone or in a batch,
// and does not disturb the calls around it.
func TestZeroCall(t *testing.T) {
	e := setup(t)
	if err := (luascript.Call{}).Exec(t.Context(), e.c).Error(); err == nil {
		t.Error("zero Call's Exec: no error")
	}
	take, err := luascript.TakeCall(limits.FixedWindow, args(e.key("z"), 3, 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	res := luascript.ExecMulti(t.Context(), e.c, []luascript.Call{{}, take, {}})
	if res[0].Error() == nil || res[2].Error() == nil {
		t.Errorf("zero Calls in a batch: %v, %v; want errors", res[0].Error(), res[2].Error())
	}
	if r, err := luascript.ParseTake(res[1]); err != nil || !r.Allowed || r.Used != 1 {
		t.Errorf("take between zero Calls = %+v, %v", r, err)
	}
	if (luascript.Call{}).Key() != "" {
		t.Error("zero Call has a key")
	}
}
