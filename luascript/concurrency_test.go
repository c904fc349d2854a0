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

func lease(key string, limit, leaseMS int64, id string) luascript.Args {
	return luascript.Args{Key: key, Limit: limit, LeaseMS: leaseMS, RequestID: id}
}

func (e *env) ccKey(subject string) string {
	return luascript.ConcurrencyKey(e.prefix, "pol", subject)
}

func (e *env) acquire(a luascript.Args) luascript.Result {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.Concurrency, a)
	if err != nil {
		e.t.Fatalf("concurrency take %+v: %v", a, err)
	}
	return r
}

func (e *env) release(key, id string) luascript.Result {
	e.t.Helper()
	r, err := luascript.Release(e.t.Context(), e.c, key, id)
	if err != nil {
		e.t.Fatalf("release %s %s: %v", key, id, err)
	}
	return r
}

func (e *env) leasePeek(key string, limit, leaseMS int64) luascript.Result {
	e.t.Helper()
	r, err := luascript.Peek(e.t.Context(), e.c, limits.Concurrency, luascript.Args{Key: key, Limit: limit, LeaseMS: leaseMS})
	if err != nil {
		e.t.Fatalf("concurrency peek %s: %v", key, err)
	}
	return r
}

func TestLeasesUpToLimitRenewAndRelease(t *testing.T) {
	e := setup(t)
	k := e.ccKey("u")
	if r := e.acquire(lease(k, 2, minute, "a")); !r.Allowed || r.Replay || r.Used != 1 || r.ResetMS != minute {
		t.Fatalf("first lease = %+v, want allowed, used 1, reset %d", r, minute)
	}
	e.acquire(lease(k, 2, minute, "b"))
	before := e.hash(k)
	r := e.acquire(lease(k, 2, minute, "c"))
	if r.Allowed || r.Used != 2 || r.RetryAfterMS <= 0 || r.RetryAfterMS > minute || r.ResetMS < r.RetryAfterMS {
		t.Fatalf("third lease with limit 2 = %+v, want denied, retry within the first lease's life", r)
	}
	sameHash(t, "after a denial", e.hash(k), before)
	if _, ok := before["l:c"]; ok {
		t.Fatal("a denied lease was recorded")
	}

	// Taking again with a held id is a heartbeat: a replay that renews.
	time.Sleep(20 * time.Millisecond)
	if r := e.acquire(lease(k, 2, minute, "a")); !r.Allowed || !r.Replay || r.Used != 2 || r.ResetMS != minute {
		t.Fatalf("renewal = %+v, want allowed replay, used 2, reset %d", r, minute)
	}
	if e.hash(k)["l:a"] <= before["l:a"] {
		t.Fatalf("renewal did not move the lease's expiry: %v -> %v", before["l:a"], e.hash(k)["l:a"])
	}
	if p := e.leasePeek(k, 2, minute); p.Used != 2 || p.ResetMS <= 0 || p.ResetMS > minute {
		t.Fatalf("peek = %+v, want used 2", p)
	}

	if r := e.release(k, "a"); !r.Released || r.Used != 1 {
		t.Fatalf("release = %+v, want released, 1 left", r)
	}
	if r := e.release(k, "a"); r.Released || r.Used != 1 {
		t.Fatalf("second release = %+v, want released false (no such lease), 1 left", r)
	}
	if r := e.acquire(lease(k, 2, minute, "c")); !r.Allowed || r.Used != 2 {
		t.Fatalf("lease after a release = %+v, want allowed", r)
	}
	e.release(k, "b")
	e.release(k, "c")
	if n, _ := e.do("EXISTS", k).AsInt64(); n != 0 {
		t.Fatal("a lease set with no lease left still exists")
	}
	if r := e.release(k, "zzz"); r.Released || r.Used != 0 {
		t.Fatalf("release on no set = %+v", r)
	}
}

func TestConcurrentLeasesNeverOverLimit(t *testing.T) {
	e := setup(t)
	k := e.ccKey("u")
	const n = 40
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := luascript.Take(t.Context(), e.c, limits.Concurrency, lease(k, 5, minute, "w"+strconv.Itoa(i)))
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
	if allowed.Load() != 5 {
		t.Fatalf("%d of %d leases granted with limit 5", allowed.Load(), n)
	}
	if p := e.leasePeek(k, 5, minute); p.Used != 5 {
		t.Fatalf("peek = %+v, want 5 held", p)
	}
}

// A holder that dies without releasing blocks the subject for at most its
// lease: the next take reclaims the expired lease.
func TestExpiredLeaseIsReclaimed(t *testing.T) {
	e := setup(t)
	k := e.ccKey("u")
	// The long lease keeps the set alive, so the dead one is reclaimed by
	// the script and not by the key's expiry.
	e.acquire(lease(k, 2, minute, "long"))
	e.acquire(lease(k, 2, 1000, "dead"))
	r := e.acquire(lease(k, 2, 1000, "next"))
	if r.Allowed || r.RetryAfterMS <= 0 || r.RetryAfterMS > 1000 {
		t.Fatalf("take while both leases are live = %+v, want denied, retry within 1000 ms", r)
	}
	time.Sleep(time.Duration(r.RetryAfterMS+50) * time.Millisecond)
	if p := e.leasePeek(k, 2, 200); p.Used != 1 {
		t.Fatalf("peek after the lease expired = %+v, want 1 live", p)
	}
	if r := e.acquire(lease(k, 2, 200, "next")); !r.Allowed || r.Replay || r.Used != 2 {
		t.Fatalf("take after the lease expired = %+v, want allowed", r)
	}
	if _, ok := e.hash(k)["l:dead"]; ok {
		t.Fatal("the expired lease is still in the set")
	}
	// The dead holder's id now starts a new lease: no replay.
	e.release(k, "next")
	if r := e.acquire(lease(k, 2, 200, "dead")); !r.Allowed || r.Replay {
		t.Fatalf("take with an expired lease's id = %+v, want a new lease", r)
	}
}

// The key lives as long as its longest live lease, and no longer.
func TestLeaseSetTTLFollowsLongestLease(t *testing.T) {
	e := setup(t)
	k := e.ccKey("u")
	e.acquire(lease(k, 3, minute, "long"))
	e.acquire(lease(k, 3, 3000, "short"))
	if p := e.pttl(k); p <= minute-5000 || p > minute {
		t.Fatalf("PTTL = %d, want the long lease's", p)
	}
	e.release(k, "long")
	if p := e.pttl(k); p <= 0 || p > 3000 {
		t.Fatalf("PTTL after releasing the long lease = %d, want at most the short one's 3000", p)
	}
	e.waitGone(k)
}

func TestLeasePolicyAndWrongType(t *testing.T) {
	e := setup(t)
	k := luascript.ConcurrencyKey(e.prefix, "", "u")
	a := lease(k, 2, minute, "a")
	a.Strict = true
	e.acquire(a)
	other := a
	other.Limit = 3
	if _, err := luascript.Take(t.Context(), e.c, limits.Concurrency, other); !errors.Is(err, luascript.ErrPolicy) {
		t.Fatalf("strict take with another limit = %v, want POLICY", err)
	}
	if _, err := luascript.Peek(t.Context(), e.c, limits.Concurrency, luascript.Args{Key: k, Limit: other.Limit, LeaseMS: other.LeaseMS, Strict: true}); !errors.Is(err, luascript.ErrPolicy) {
		t.Fatalf("strict peek with another limit = %v, want POLICY", err)
	}
	// A named policy's lowered limit applies at once; a holder still renews.
	named := e.ccKey("v")
	e.acquire(lease(named, 2, minute, "a"))
	e.acquire(lease(named, 2, minute, "b"))
	if r := e.acquire(lease(named, 1, minute, "c")); r.Allowed {
		t.Fatalf("take over a lowered limit = %+v, want denied", r)
	}
	if r := e.acquire(lease(named, 1, minute, "a")); !r.Allowed || !r.Replay {
		t.Fatalf("renewal over a lowered limit = %+v, want allowed replay", r)
	}

	s := e.ccKey("s")
	e.mustDo("SET", s, "v", "PX", "60000")
	for name, err := range map[string]error{
		"take": func() error {
			_, err := luascript.Take(t.Context(), e.c, limits.Concurrency, lease(s, 1, minute, "a"))
			return err
		}(),
		"peek": func() error {
			_, err := luascript.Peek(t.Context(), e.c, limits.Concurrency, luascript.Args{Key: s, Limit: 1, LeaseMS: 1})
			return err
		}(),
		"release": func() error { _, err := luascript.Release(t.Context(), e.c, s, "a"); return err }(),
	} {
		if !errors.Is(err, luascript.ErrWrongType) {
			t.Errorf("%s on a string = %v, want WRONGTYPE", name, err)
		}
	}
	// A token bucket at a lease set's key is not misread.
	h := e.ccKey("h")
	e.mustDo("HSET", h, "tat", "1", "rem", "0", "policy", "1:1:1")
	e.mustDo("PEXPIRE", h, "60000")
	if _, err := luascript.Take(t.Context(), e.c, limits.Concurrency, lease(h, 1, minute, "a")); !errors.Is(err, luascript.ErrWrongType) {
		t.Fatalf("take on a token bucket = %v, want WRONGTYPE", err)
	}
	// Every field of a lease set is its policy or a lease with a decimal
	// expiry: any other hash is refused by each script, and left as it was.
	later := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	for name, fields := range map[string][]string{
		"another field":          {"policy", "1:60000", "l:b", later, "x:c", later},
		"a lease without a name": {"policy", "1:60000", "l:", later},
		"a lease with no expiry": {"policy", "1:60000", "l:b", "soon"},
		"a policy of words":      {"policy", "one:minute", "l:b", later},
		"no policy":              {"l:b", later},
	} {
		h := e.ccKey("other-" + strings.ReplaceAll(name, " ", "-"))
		e.mustDo(append([]string{"HSET", h}, fields...)...)
		e.mustDo("PEXPIRE", h, "60000")
		errs := map[string]error{
			"take": func() error {
				_, err := luascript.Take(t.Context(), e.c, limits.Concurrency, lease(h, 5, minute, "a"))
				return err
			}(),
			"peek": func() error {
				_, err := luascript.Peek(t.Context(), e.c, limits.Concurrency, luascript.Args{Key: h, Limit: 5, LeaseMS: minute})
				return err
			}(),
			"release": func() error { _, err := luascript.Release(t.Context(), e.c, h, "b"); return err }(),
		}
		for op, err := range errs {
			if !errors.Is(err, luascript.ErrWrongType) {
				t.Errorf("%s on a hash with %s = %v, want WRONGTYPE", op, name, err)
			}
		}
		got, err := e.c.Do(t.Context(), e.c.B().Hgetall().Key(h).Build()).AsStrMap()
		if err != nil || len(got) != len(fields)/2 {
			t.Fatalf("hash with %s after the refusals = %v, %v; want its %d fields", name, got, err, len(fields)/2)
		}
		for i := 0; i < len(fields); i += 2 {
			if got[fields[i]] != fields[i+1] {
				t.Errorf("hash with %s: %s = %q after the refusals, want %q", name, fields[i], got[fields[i]], fields[i+1])
			}
		}
	}
	// A take needs a request id: it names the lease.
	if _, err := luascript.Take(t.Context(), e.c, limits.Concurrency, lease(k, 2, minute, "")); !errors.Is(err, luascript.ErrInvalid) {
		t.Fatalf("take without a request id = %v, want INVALID", err)
	}
	for name, argv := range map[string][]string{
		"limit 0":          {"0", "1000", "0", "a"},
		"limit too big":    {"100001", "1000", "0", "a"},
		"lease 0":          {"1", "0", "0", "a"},
		"no request id":    {"1", "1000", "0", ""},
		"bad request id":   {"1", "1000", "0", "a b"},
		"too few":          {"1", "1000", "0"},
		"strict not 0 / 1": {"1", "1000", "x", "a"},
	} {
		err := e.c.Do(t.Context(), e.c.B().Eval().Script(luascript.ScriptText("concurrency_take.lua")).Numkeys(1).Key(e.ccKey("new")).Arg(argv...).Build()).Error()
		if err == nil || !strings.HasPrefix(err.Error(), "INVALID ") {
			t.Errorf("script with %s = %v, want INVALID", name, err)
		}
	}
}
