package luascript_test

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
)

// checksEnv builds checks of every algorithm on fresh keys of e.
type takeCheck struct {
	call  luascript.Call
	keys  []string // every key the check may write
	parse func(rueidis.RedisResult) (allowed, replay bool, err error)
}

func (e *env) fwCheck(t *testing.T, subject string, limit, cost int64, id string) takeCheck {
	t.Helper()
	k := e.key(subject)
	c, err := luascript.TakeCall(limits.FixedWindow, luascript.Args{Key: k, Limit: limit, WindowMS: 60_000, Cost: cost, RequestID: id, MaxRequestIDs: 100})
	if err != nil {
		t.Fatal(err)
	}
	return takeCheck{call: c, keys: []string{k}, parse: func(res rueidis.RedisResult) (bool, bool, error) {
		r, err := luascript.ParseTake(res)
		return r.Allowed, r.Replay, err
	}}
}

func (e *env) tbCheck(t *testing.T, subject string, burst, cost int64, id string) takeCheck {
	t.Helper()
	k := luascript.TokenBucketKey(e.prefix, "pol", subject)
	c, err := luascript.TakeCall(limits.TokenBucket, luascript.Args{Key: k,
		TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: 3_600_000, Burst: burst},
		Cost:        cost, RequestID: id, DedupeMS: 60_000, MaxRequestIDs: 100})
	if err != nil {
		t.Fatal(err)
	}
	return takeCheck{call: c, keys: []string{k}, parse: func(res rueidis.RedisResult) (bool, bool, error) {
		r, err := luascript.ParseTake(res)
		return r.Allowed, r.Replay, err
	}}
}

func (e *env) swCheck(t *testing.T, subject string, limit, cost int64, id string) takeCheck {
	t.Helper()
	k := luascript.SlidingWindowKey(e.prefix, "pol", subject)
	c, err := luascript.TakeCall(limits.SlidingWindow, luascript.Args{Key: k, Limit: limit, WindowMS: 3_600_000, Cost: cost, RequestID: id, MaxRequestIDs: 100})
	if err != nil {
		t.Fatal(err)
	}
	return takeCheck{call: c, keys: []string{k}, parse: func(res rueidis.RedisResult) (bool, bool, error) {
		r, err := luascript.ParseTake(res)
		return r.Allowed, r.Replay, err
	}}
}

func (e *env) ccCheck(t *testing.T, subject string, limit int64, id string) takeCheck {
	t.Helper()
	k := luascript.ConcurrencyKey(e.prefix, "pol", subject)
	c, err := luascript.TakeCall(limits.Concurrency, luascript.Args{Key: k, Limit: limit, LeaseMS: 60_000, RequestID: id})
	if err != nil {
		t.Fatal(err)
	}
	return takeCheck{call: c, keys: []string{k}, parse: func(res rueidis.RedisResult) (bool, bool, error) {
		r, err := luascript.ParseTake(res)
		return r.Allowed, r.Replay, err
	}}
}

func (e *env) calCheck(t *testing.T, subject string, limit, cost int64, id string) takeCheck {
	t.Helper()
	cw := limits.CalendarWindow{Limit: limit, Period: limits.PeriodDay, TimeZone: "UTC", WeekStart: limits.DefaultWeekStart}
	k := luascript.CalendarKey(e.prefix, "pol", subject)
	p := luascript.CalendarAround(cw, 0, time.Now())
	c, err := luascript.TakeCall(limits.Calendar, luascript.Args{Key: k, Spec: cw.Spec(), Limit: limit, Periods: p, Cost: cost, RequestID: id, MaxRequestIDs: 100})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, s := range p.Starts {
		keys = append(keys, luascript.CalendarPeriodKey(k, s))
	}
	return takeCheck{call: c, keys: keys, parse: func(res rueidis.RedisResult) (bool, bool, error) {
		r, err := luascript.ParseTake(res)
		return r.Allowed, r.Replay, err
	}}
}

func digestOf(id string, checks []takeCheck) string {
	if id == "" {
		return ""
	}
	var parts []string
	for _, c := range checks {
		parts = append(parts, c.call.Key())
	}
	return luascript.ChecksDigest(parts)
}

func (e *env) takeChecks(t *testing.T, id string, checks ...takeCheck) (luascript.ChecksResult, error) {
	t.Helper()
	return e.checksDigest(t, id, digestOf(id, checks), checks...)
}

func (e *env) checksDigest(t *testing.T, id, digest string, checks ...takeCheck) (luascript.ChecksResult, error) {
	t.Helper()
	mc := make([]luascript.TakeCheck, len(checks))
	for i, c := range checks {
		mc[i] = luascript.TakeCheck{Call: c.call}
	}
	call, err := luascript.TakeChecksCall(mc, id, digest)
	if err != nil {
		return luascript.ChecksResult{}, err
	}
	return luascript.ParseTakeChecks(call.Exec(t.Context(), e.c), len(checks))
}

// state is every key of checks: its hash and whether it has a TTL.
func (e *env) state(checks []takeCheck) map[string]map[string]string {
	s := map[string]map[string]string{}
	for _, c := range checks {
		for _, k := range c.keys {
			s[k] = e.hash(k)
		}
	}
	return s
}

func sameState(t *testing.T, what string, got, want map[string]map[string]string) {
	t.Helper()
	for k := range want {
		sameHash(t, what+": "+k, got[k], want[k])
	}
}

func verdicts(t *testing.T, r luascript.ChecksResult, checks []takeCheck) (allowed, replay []bool) {
	t.Helper()
	for i, c := range checks {
		a, p, err := c.parse(r.Checks[i])
		if err != nil {
			t.Fatalf("check %d: %v", i+1, err)
		}
		allowed, replay = append(allowed, a), append(replay, p)
	}
	return allowed, replay
}

// Every algorithm in one take: all consume together, a denial of one
// leaves every key as it was, and the request id replays them all.
func TestTakeOfChecksEveryAlgorithmAllOrNothing(t *testing.T) {
	e := setup(t)
	mk := func(id string, fwCost int64) []takeCheck {
		return []takeCheck{
			e.fwCheck(t, "u", 3, fwCost, id), e.tbCheck(t, "u", 5, 1, id), e.swCheck(t, "u", 5, 1, id),
			e.ccCheck(t, "u", 5, id), e.calCheck(t, "u", 5, 1, id),
		}
	}
	checks := mk("a", 2)
	r, err := e.takeChecks(t, "a", checks...)
	if err != nil || !r.Applied {
		t.Fatalf("first take = %+v, %v; want applied", r, err)
	}
	if a, _ := verdicts(t, r, checks); !all(a) {
		t.Fatalf("verdicts %v, want all allowed", a)
	}
	if u := e.hash(e.key("u"))["used"]; u != "2" {
		t.Fatalf("fixed window used = %q, want 2", u)
	}
	// Its record keeps the set's digest, and a single take's fields lead.
	rec := e.hash(e.key("u"))["r:a"]
	if want := "2:2:m" + digestOf("a", checks) + ":2"; rec != want {
		t.Fatalf("record r:a = %q, want %q", rec, want)
	}

	before := e.state(checks)
	// Cost 2 on the fixed window no longer fits: nothing is written anywhere.
	denied := mk("b", 2)
	r, err = e.takeChecks(t, "b", denied...)
	if err != nil || r.Applied {
		t.Fatalf("take past the fixed window = %+v, %v; want not applied", r, err)
	}
	a, _ := verdicts(t, r, denied)
	if a[0] || !a[1] || !a[2] || !a[3] || !a[4] {
		t.Fatalf("verdicts %v, want only the fixed window denied", a)
	}
	// Each check that accepted answers as alone, its reset included.
	for i := 1; i < len(denied); i++ {
		if res, err := luascript.ParseTake(r.Checks[i]); err != nil || res.ResetMS <= 0 || res.Healed {
			t.Fatalf("check %d of the denied take = %+v, %v; want its reset, nothing healed", i+1, res, err)
		}
	}
	sameState(t, "after a denied take", e.state(checks), before)

	// The same request id replays every check and writes nothing.
	r, err = e.takeChecks(t, "a", mk("a", 2)...)
	if err != nil || !r.Applied {
		t.Fatalf("replay = %+v, %v", r, err)
	}
	a, p := verdicts(t, r, checks)
	if !all(a) || !all(p) {
		t.Fatalf("replay verdicts %v replays %v, want all", a, p)
	}
	after := e.state(checks)
	for k, h := range before {
		if strings.Contains(k, ":cc:") {
			continue // a replay renews the lease
		}
		sameHash(t, "after a replay: "+k, after[k], h)
	}
}

func all(v []bool) bool {
	for _, b := range v {
		if !b {
			return false
		}
	}
	return true
}

// A request id accepted with one set of checks is CONFLICT with another:
// a subset, a superset, another cost. Nothing is written.
func TestTakeOfChecksOtherSetIsConflict(t *testing.T) {
	e := setup(t)
	a, b, c := e.fwCheck(t, "a", 10, 1, "x"), e.tbCheck(t, "b", 10, 1, "x"), e.swCheck(t, "c", 10, 1, "x")
	if r, err := e.takeChecks(t, "x", a, b); err != nil || !r.Applied {
		t.Fatalf("take = %+v, %v", r, err)
	}
	before := e.state([]takeCheck{a, b, c})
	for name, set := range map[string][]takeCheck{
		"subset":   {a},
		"superset": {a, b, c},
		"cost":     {a, e.tbCheck(t, "b", 10, 2, "x")},
	} {
		digest := digestOf("x", set)
		if name == "cost" {
			digest = luascript.ChecksDigest([]string{a.call.Key(), b.call.Key(), "cost 2"})
		}
		_, err := e.checksDigest(t, "x", digest, set...)
		if !errors.Is(err, luascript.ErrConflict) || !strings.Contains(err.Error(), "check ") {
			t.Fatalf("%s: %v, want CONFLICT naming the check", name, err)
		}
	}
	sameState(t, "after conflicts", e.state([]takeCheck{a, b, c}), before)
	// The same set in another order is the same take.
	if r, err := e.takeChecks(t, "x", b, a); err != nil || !r.Applied {
		t.Fatalf("same set reordered = %+v, %v", r, err)
	}
}

func TestTakeOfChecksRefusesBadCalls(t *testing.T) {
	e := setup(t)
	a := e.fwCheck(t, "a", 10, 1, "")
	peek, err := luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: e.key("a"), Limit: 10, WindowMS: 1000})
	if err != nil {
		t.Fatal(err)
	}
	withID := e.fwCheck(t, "b", 10, 1, "x")
	for name, tc := range map[string]struct {
		checks     []luascript.TakeCheck
		id, digest string
	}{
		"none":       {nil, "", ""},
		"too many":   {make([]luascript.TakeCheck, luascript.MaxChecks+1), "", ""},
		"same key":   {[]luascript.TakeCheck{{Call: a.call}, {Call: e.fwCheck(t, "a", 5, 1, "").call}}, "", ""},
		"a peek":     {[]luascript.TakeCheck{{Call: peek}}, "", ""},
		"other id":   {[]luascript.TakeCheck{{Call: withID.call}}, "y", luascript.ChecksDigest(nil)},
		"no digest":  {[]luascript.TakeCheck{{Call: withID.call}}, "x", ""},
		"bad digest": {[]luascript.TakeCheck{{Call: a.call}}, "", "00"},
	} {
		if _, err := luascript.TakeChecksCall(tc.checks, tc.id, tc.digest); !errors.Is(err, luascript.ErrInvalid) {
			t.Errorf("%s: %v, want INVALID", name, err)
		}
	}
	// The refusal names the two checks that share a key, past checks of
	// several keys each (a calendar window's periods).
	dup := []luascript.TakeCheck{{Call: e.calCheck(t, "c", 10, 1, "").call}, {Call: a.call}, {Call: e.calCheck(t, "d", 10, 1, "").call}, {Call: e.fwCheck(t, "a", 5, 1, "").call}}
	if _, err := luascript.TakeChecksCall(dup, "", ""); err == nil || !strings.Contains(err.Error(), "checks 2 and 4 count against the same limit") {
		t.Errorf("a key given twice: %v, want checks 2 and 4 named", err)
	}
	// Past Go's checks, the script refuses too, before touching Redis.
	src := luascript.ScriptText("take_checks.lua")
	for name, argv := range map[string][]string{
		"no checks":     {"0", "", ""},
		"unknown body":  {"1", "", "", "nope", "0", "1", "6", "10", "60000", "1", "100", "0", ""},
		"keys left":     {"1", "", "", "fixed_window_take", "0", "1", "6", "10", "60000", "1", "100", "0", ""},
		"id mismatch":   {"1", "x", "0123456789abcdef", "fixed_window_take", "0", "1", "6", "10", "60000", "1", "100", "0", "y"},
		"short digest":  {"1", "x", "0123", "fixed_window_take", "0", "1", "6", "10", "60000", "1", "100", "0", "x"},
		"args left":     {"1", "", "", "fixed_window_take", "0", "1", "6", "10", "60000", "1", "100", "0", "", "extra"},
		"a body's args": {"1", "", "", "fixed_window_take", "0", "1", "6", "0", "60000", "1", "100", "0", ""},
	} {
		keys := []string{e.key("s")}
		if name == "keys left" {
			keys = append(keys, e.key("t"))
		}
		cmd := append([]string{"EVAL", src, strconv.Itoa(len(keys))}, keys...)
		err := e.do(append(cmd, argv...)...).Error()
		if err == nil || !strings.HasPrefix(err.Error(), "INVALID") {
			t.Errorf("%s: %v, want INVALID", name, err)
		}
	}
	if n, _ := e.do("EXISTS", e.key("s"), e.key("t")).AsInt64(); n != 0 {
		t.Fatalf("refused calls wrote %d keys", n)
	}
}

// 50 callers take overlapping pairs of three small windows at once: no
// window ever admits more than its limit, and each window's use is exactly
// what the accepted takes that name it consumed, so no denied take left a
// unit behind anywhere.
func TestTakeOfChecksConcurrentCallersNeverOverAdmit(t *testing.T) {
	e := setup(t)
	const limit, callers, rounds = 20, 50, 4
	subjects := []string{"x", "y", "z"}
	var mu sync.Mutex
	accepted := map[string]int64{}
	var wg sync.WaitGroup
	errs := make(chan error, callers*rounds)
	for g := range callers {
		wg.Go(func() {
			for r := range rounds {
				i := (g + r) % 3
				s1, s2 := subjects[i], subjects[(i+1)%3]
				id := "c" + strconv.Itoa(g) + "-" + strconv.Itoa(r)
				checks := []takeCheck{e.fwCheck(t, s1, limit, 1, id), e.swCheck(t, s2, limit, 2, id)}
				res, err := e.takeChecks(t, id, checks...)
				if err != nil {
					errs <- err
					return
				}
				if res.Applied {
					mu.Lock()
					accepted["fw:"+s1]++
					accepted["sw:"+s2] += 2
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, s := range subjects {
		fw, _ := strconv.ParseInt(e.hash(e.key(s))["used"], 10, 64)
		sw, _ := strconv.ParseInt(e.hash(luascript.SlidingWindowKey(e.prefix, "pol", s))["c"], 10, 64)
		if fw > limit || sw > limit {
			t.Fatalf("%s: fixed window used %d, sliding window counted %d, limit %d", s, fw, sw, limit)
		}
		if fw != accepted["fw:"+s] || sw != accepted["sw:"+s] {
			t.Fatalf("%s: used %d and %d, accepted takes consumed %d and %d", s, fw, sw, accepted["fw:"+s], accepted["sw:"+s])
		}
	}
	total := accepted["fw:x"] + accepted["fw:y"] + accepted["fw:z"]
	if total == 0 || total == callers*rounds {
		t.Fatalf("%d of %d takes accepted: the limits were not contended", total, callers*rounds)
	}
}

// Under maxmemory, the take is refused whole, or applied whole.
func TestTakeOfChecksFullRedisWritesNothing(t *testing.T) {
	e := setup(t)
	e.mustDo("CONFIG", "SET", "maxmemory-policy", "noeviction")
	checks := []takeCheck{e.fwCheck(t, "a", 10, 1, ""), e.tbCheck(t, "a", 10, 1, "")}
	if _, err := e.takeChecks(t, "", checks...); err != nil {
		t.Fatal(err)
	}
	before := e.state(checks)
	e.mustDo("CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() { _ = e.c.Do(t.Context(), e.c.B().Arbitrary("CONFIG", "SET", "maxmemory", "0").Build()).Error() })
	_, err := e.takeChecks(t, "", checks...)
	if re, ok := rueidis.IsRedisErr(errors.Unwrap(err)); !ok || !strings.HasPrefix(re.Error(), "OOM") {
		t.Fatalf("take on a full Redis: %v, want OOM", err)
	}
	sameState(t, "after the refusal", e.state(checks), before)
}

// The give back of an accepted step leaves each check's state as before
// the take, once: a second give back finds nothing to give.
func TestGiveBackUndoesATake(t *testing.T) {
	e := setup(t)
	mk := func(id string) []takeCheck {
		return []takeCheck{
			e.fwCheck(t, "g", 10, 2, id), e.tbCheck(t, "g", 10, 3, id), e.swCheck(t, "g", 10, 2, id),
			e.ccCheck(t, "g", 5, id), e.calCheck(t, "g", 10, 2, id),
		}
	}
	if r, err := e.takeChecks(t, "a", mk("a")...); err != nil || !r.Applied {
		t.Fatalf("first take %+v, %v", r, err)
	}
	checks := mk("b")
	fields := map[string][]string{":fw:": {"used", "ids"}, ":tb:": {"tat", "rem", "ids"}, ":sw:": {"c", "p", "ids"}, ":cal:": {"used", "ids"}}
	pick := func(s map[string]map[string]string) map[string]string {
		out := map[string]string{}
		for k, h := range s {
			for part, fs := range fields {
				if strings.Contains(k, part) {
					for _, f := range fs {
						out[k+" "+f] = h[f]
					}
				}
			}
			if strings.Contains(k, ":cc:") {
				out[k+" lease b"] = h["l:b"]
			}
		}
		return out
	}
	before := pick(e.state(checks))
	if r, err := e.takeChecks(t, "b", checks...); err != nil || !r.Applied {
		t.Fatalf("second take %+v, %v", r, err)
	}
	mc := make([]luascript.TakeCheck, len(checks))
	for i, c := range checks {
		mc[i] = luascript.TakeCheck{Call: c.call}
	}
	call, err := luascript.GiveBackCall(mc, "b", digestOf("b", checks))
	if err != nil {
		t.Fatal(err)
	}
	for round, want := range []bool{true, false} {
		given, err := luascript.ParseGiveBack(call.Exec(t.Context(), e.c), len(checks))
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range given {
			if g != want {
				t.Fatalf("give back %d: check %d given back %v, want %v", round+1, i+1, g, want)
			}
		}
	}
	after := pick(e.state(checks))
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s = %q after the give back, %q before the take", k, after[k], v)
		}
	}
	for _, c := range checks {
		if _, ok := e.hash(c.call.Key())["r:b"]; ok {
			t.Errorf("%s still holds the record of the given back take", c.call.Key())
		}
	}
	// The first take, of another id, is not given back.
	first := mk("a")
	mc = mc[:0]
	for _, c := range first {
		mc = append(mc, luascript.TakeCheck{Call: c.call})
	}
	call, _ = luascript.GiveBackCall(mc, "a", luascript.ChecksDigest([]string{"another set"}))
	if given, err := luascript.ParseGiveBack(call.Exec(t.Context(), e.c), len(first)); err != nil || given[0] || given[1] || given[2] || given[4] {
		t.Fatalf("give back under another digest: %v, %v; want nothing but the lease", given, err)
	}
}

// Takes of several limits in one batch script call, beside a take of one
// (a call of its own, after it in the same round trip): each decides as
// it would alone.
func TestTakeOfChecksInABatch(t *testing.T) {
	e := setup(t)
	// Loaded, so that the batch is not sent again (EVAL) after the take of
	// one, as after a NOSCRIPT.
	if err := luascript.Load(t.Context(), e.c); err != nil {
		t.Fatal(err)
	}
	var calls []luascript.Call
	var sets [][]takeCheck
	for i := range 3 {
		id := "b" + strconv.Itoa(i)
		set := []takeCheck{e.fwCheck(t, "x"+strconv.Itoa(i), 2, 1, id), e.swCheck(t, "shared", 2, 1, id)}
		mc := []luascript.TakeCheck{{Call: set[0].call}, {Call: set[1].call}}
		call, err := luascript.TakeChecksCall(mc, id, digestOf(id, set))
		if err != nil {
			t.Fatal(err)
		}
		calls, sets = append(calls, call), append(sets, set)
	}
	one, err := luascript.TakeCall(limits.FixedWindow, args(e.key("x0"), 2, 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	calls = append(calls, one)
	res := luascript.ExecBatch(t.Context(), e.c, calls)
	for i, want := range []bool{true, true, false} {
		r, err := luascript.ParseTakeChecks(res[i], 2)
		if err != nil || r.Applied != want {
			t.Fatalf("take %d in the batch: %+v, %v; want applied %v (the shared window holds 2)", i, r, err, want)
		}
	}
	if r, err := luascript.ParseTake(res[3]); err != nil || !r.Allowed || r.Used != 2 {
		t.Fatalf("take of one in the batch: %+v, %v", r, err)
	}
	if used := e.hash(e.key("x2"))["used"]; used != "" {
		t.Fatalf("the denied take's window holds used %q", used)
	}
}
