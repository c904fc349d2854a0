package luascript_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
)

var utcDay = limits.CalendarWindow{Limit: 5, Period: limits.PeriodDay, TimeZone: "UTC", WeekStart: time.Monday}

// cal is a take of cost on the calendar window of subject, with the
// periods computed around at (the caller's clock).
func (e *env) cal(c limits.CalendarWindow, subject string, at time.Time, cost int64, id string) luascript.Args {
	return luascript.Args{
		Key: luascript.CalendarKey(e.prefix, "pol", subject), Spec: c.Spec(), Limit: c.Limit,
		Periods: luascript.CalendarAround(c, c.Offset(subject), at), Cost: cost, RequestID: id, MaxRequestIDs: 100,
	}
}

func (e *env) calTake(a luascript.Args) luascript.Result {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.Calendar, a)
	if err != nil {
		e.t.Fatalf("calendar take %+v: %v", a, err)
	}
	return r
}

func (e *env) calTakeErr(a luascript.Args, want error) error {
	e.t.Helper()
	r, err := luascript.Take(e.t.Context(), e.c, limits.Calendar, a)
	if !errors.Is(err, want) {
		e.t.Fatalf("calendar take %+v = %+v, %v; want %v", a, r, err, want)
	}
	return err
}

func (e *env) pexpiretime(key string) int64 {
	e.t.Helper()
	n, err := e.do("PEXPIRETIME", key).AsInt64()
	if err != nil {
		e.t.Fatalf("PEXPIRETIME %s: %v", key, err)
	}
	return n
}

// wantExpiry checks that key expires a second after end. The script sets
// the TTL from the TIME it read, and Redis counts it from its clock at the
// PEXPIRE a moment later, so the expiry falls at end + 1s, or later by at
// most the call's duration (before and after bracket it, by Redis's clock).
func (e *env) wantExpiry(key string, end, before, after time.Time) {
	e.t.Helper()
	got, want := e.pexpiretime(key), end.UnixMilli()+1000
	if got < want-1 || got > want+after.Sub(before).Milliseconds()+1 {
		e.t.Fatalf("PEXPIRETIME %s = %d, want %d (+%v at most)", key, got, want, after.Sub(before))
	}
}

// redisNow is Redis's clock.
func (e *env) redisNow() time.Time {
	e.t.Helper()
	v, err := e.do("TIME").AsStrSlice()
	if err != nil {
		e.t.Fatal(err)
	}
	var s, us int64
	for i, p := range v {
		var n int64
		for _, c := range p {
			n = n*10 + int64(c-'0')
		}
		if i == 0 {
			s = n
		} else {
			us = n
		}
	}
	return time.Unix(s, us*1000)
}

func TestCalendarTake(t *testing.T) {
	e := setup(t)
	before := e.redisNow()
	_, end := utcDay.Bounds(before)
	start, _ := utcDay.Bounds(before)
	a := e.cal(utcDay, "u", before, 3, "a")
	key := luascript.CalendarPeriodKey(a.Key, start.UnixMilli())

	r := e.calTake(a)
	after := e.redisNow()
	if !r.Allowed || r.Used != 3 || r.Replay {
		t.Fatalf("first take = %+v, want allowed, used 3", r)
	}
	// reset_ms is until the day's end, by Redis's clock.
	if lo, hi := end.Sub(after).Milliseconds(), end.Sub(before).Milliseconds()+1; r.ResetMS < lo || r.ResetMS > hi {
		t.Fatalf("reset_ms = %d, want %d..%d", r.ResetMS, lo, hi)
	}
	// The key names its period and ends a second after it.
	e.wantExpiry(key, end, before, after)
	sameHash(t, "after the first take", e.hash(key), map[string]string{
		"used": "3", "policy": "5:day:UTC:-:0", "ids": "1", "r:a": "3:3",
	})

	if r := e.calTake(a); !r.Replay || !r.Allowed || r.Used != 3 {
		t.Fatalf("replay = %+v, want a replay at used 3", r)
	}
	conflict := a
	conflict.Cost = 2
	e.calTakeErr(conflict, luascript.ErrConflict)

	b := e.cal(utcDay, "u", before, 3, "")
	if r := e.calTake(b); r.Allowed || r.Used != 3 || r.ResetMS <= 0 {
		t.Fatalf("take over the limit = %+v, want denied at used 3", r)
	}
	b.Cost = 2
	if r := e.calTake(b); !r.Allowed || r.Used != 5 {
		t.Fatalf("take of what is left = %+v, want allowed at used 5", r)
	}

	p, err := luascript.Peek(t.Context(), e.c, limits.Calendar, luascript.Args{
		Key: a.Key, Spec: a.Spec, Limit: a.Limit, Periods: a.Periods, Strict: true,
	})
	if err != nil || !p.Exists || p.Used != 5 || p.ResetMS <= 0 || p.ResetMS > r.ResetMS {
		t.Fatalf("peek = %+v, %v; want used 5", p, err)
	}
	empty, err := luascript.Peek(t.Context(), e.c, limits.Calendar, luascript.Args{
		Key: luascript.CalendarKey(e.prefix, "pol", "nobody"), Spec: a.Spec, Limit: a.Limit, Periods: a.Periods,
	})
	if err != nil || empty.Exists || empty.Used != 0 || empty.ResetMS <= 0 {
		t.Fatalf("peek of no window = %+v, %v; want none, with the time to the period's end", empty, err)
	}
}

func TestCalendarPolicy(t *testing.T) {
	e := setup(t)
	now := e.redisNow()
	a := e.cal(utcDay, "u", now, 4, "")
	e.calTake(a)

	// Inline limits that differ in any field are POLICY, and write nothing.
	for _, c := range []limits.CalendarWindow{
		{Limit: 6, Period: limits.PeriodDay, TimeZone: "UTC"},
		{Limit: 5, Period: limits.PeriodDay, TimeZone: "Etc/GMT"},
		{Limit: 5, Period: limits.PeriodDay, TimeZone: "UTC", JitterMS: 1},
	} {
		b := e.cal(c, "u", now, 1, "")
		// Same periods, so the same key: only the spec differs.
		b.Periods, b.Strict = a.Periods, true
		e.calTakeErr(b, luascript.ErrPolicy)
	}
	// A named policy's new limit applies at once.
	lower := utcDay
	lower.Limit = 4
	b := e.cal(lower, "u", now, 1, "")
	if r := e.calTake(b); r.Allowed || r.Used != 4 {
		t.Fatalf("take under a lower limit = %+v, want denied at used 4", r)
	}
	higher := utcDay
	higher.Limit = 10
	b = e.cal(higher, "u", now, 6, "")
	if r := e.calTake(b); !r.Allowed || r.Used != 10 {
		t.Fatalf("take under a higher limit = %+v, want allowed at used 10", r)
	}
}

func TestCalendarRequestIDsFull(t *testing.T) {
	e := setup(t)
	now := e.redisNow()
	a := e.cal(utcDay, "u", now, 1, "a")
	a.MaxRequestIDs = 1
	e.calTake(a)
	a.RequestID = "b"
	e.calTakeErr(a, luascript.ErrRequestIDsFull)
	a.RequestID = ""
	if r := e.calTake(a); !r.Allowed || r.Used != 2 {
		t.Fatalf("take without an id = %+v, want allowed", r)
	}
}

// The period is the one holding Redis's clock, whatever the caller's says,
// within a period; beyond that the script refuses and writes nothing.
func TestCalendarRedisClockDecides(t *testing.T) {
	e := setup(t)
	now := e.redisNow()
	hour := limits.CalendarWindow{Limit: 5, Period: limits.PeriodHour, TimeZone: "Asia/Kolkata"}
	start, end := hour.Bounds(now)
	want := luascript.CalendarPeriodKey(luascript.CalendarKey(e.prefix, "pol", "u"), start.UnixMilli())
	for _, skew := range []time.Duration{-50 * time.Minute, 50 * time.Minute} {
		r := e.calTake(e.cal(hour, "u", now.Add(skew), 1, ""))
		if r.ResetMS <= 0 || r.ResetMS > end.Sub(now).Milliseconds()+1 {
			t.Fatalf("skew %v: reset_ms = %d, want until %v", skew, r.ResetMS, end)
		}
	}
	if m := e.hash(want); m["used"] != "2" {
		t.Fatalf("%s = %v, want both takes counted in Redis's hour", want, m)
	}
	_, err := luascript.Take(t.Context(), e.c, limits.Calendar, e.cal(hour, "u", now.Add(-3*time.Hour), 1, ""))
	if le := (*luascript.Error)(nil); !errors.As(err, &le) || le.Code != luascript.CodeClockSkew {
		t.Fatalf("take three hours behind = %v, want %s", err, luascript.CodeClockSkew)
	}
	if keys, _ := e.do("KEYS", e.prefix+"*").AsStrSlice(); len(keys) != 1 {
		t.Fatalf("keys %v, want only Redis's hour", keys)
	}
}

// Jitter moves a subject's boundaries by its own offset, and its key
// still lives until its (moved) end plus the margin.
func TestCalendarJitter(t *testing.T) {
	e := setup(t)
	c := limits.CalendarWindow{Limit: 5, Period: limits.PeriodMinute, TimeZone: "UTC", JitterMS: 59_999}
	var offsets []time.Duration
	for _, s := range []string{"a", "b", "c", "d"} {
		off := c.Offset(s)
		offsets = append(offsets, off)
		before := e.redisNow()
		a := e.cal(c, s, before, 1, "")
		r := e.calTake(a)
		after := e.redisNow()
		start, end := c.Bounds(before.Add(-off))
		if s2, _ := c.Bounds(after.Add(-off)); !s2.Equal(start) {
			// The subject's boundary passed during the call, so either
			// minute may hold the take; the other subjects are checked.
			continue
		}
		key := luascript.CalendarPeriodKey(a.Key, start.UnixMilli())
		e.wantExpiry(key, end.Add(off), before, after)
		if lo, hi := end.Add(off).Sub(after).Milliseconds(), end.Add(off).Sub(before).Milliseconds()+1; r.ResetMS < lo || r.ResetMS > hi {
			t.Fatalf("subject %s: reset_ms = %d, want %d..%d", s, r.ResetMS, lo, hi)
		}
	}
	if offsets[0] == offsets[1] && offsets[1] == offsets[2] && offsets[2] == offsets[3] {
		t.Fatalf("four subjects share one offset %v", offsets[0])
	}
}

func TestCalendarHealsTTL(t *testing.T) {
	e := setup(t)
	now := e.redisNow()
	a := e.cal(utcDay, "u", now, 1, "")
	e.calTake(a)
	start, end := utcDay.Bounds(now)
	key := luascript.CalendarPeriodKey(a.Key, start.UnixMilli())
	e.mustDo("PERSIST", key)
	a.Strict, a.Spec = true, "5:day:Etc/GMT:-:0"
	before := e.redisNow()
	err := e.calTakeErr(a, luascript.ErrPolicy)
	after := e.redisNow()
	if le := (*luascript.Error)(nil); !errors.As(err, &le) || !le.Healed {
		t.Fatalf("refusal %v does not say the TTL was restored", err)
	}
	e.wantExpiry(key, end, before, after)
}

func TestCalendarWrongType(t *testing.T) {
	e := setup(t)
	now := e.redisNow()
	a := e.cal(utcDay, "u", now, 1, "")
	start, _ := utcDay.Bounds(now)
	key := luascript.CalendarPeriodKey(a.Key, start.UnixMilli())
	e.mustDo("SET", key, "x", "EX", "60")
	e.calTakeErr(a, luascript.ErrWrongType)
}

func TestCalendarInvalid(t *testing.T) {
	e := setup(t)
	now := e.redisNow()
	good := e.cal(utcDay, "u", now, 1, "")
	for name, mod := range map[string]func(*luascript.Args){
		"cost above limit": func(a *luascript.Args) { a.Cost = 6 },
		"no key":           func(a *luascript.Args) { a.Key = "" },
		"edges decrease":   func(a *luascript.Args) { a.Periods.Edges[2] = a.Periods.Edges[1] },
		"bad id":           func(a *luascript.Args) { a.RequestID = "a b" },
		"no spec":          func(a *luascript.Args) { a.Spec = "" },
	} {
		a := good
		mod(&a)
		if _, err := luascript.TakeCall(limits.Calendar, a); !errors.Is(err, luascript.ErrInvalid) {
			t.Errorf("%s: %v, want INVALID", name, err)
		}
	}
	// The script checks again what the builder does, before any write.
	for name, args := range map[string][]string{
		"spec of another limit": {"5", "1", "10", "0", "", "6:day:UTC:-:0", "0", "1", "2", "3"},
		"edges out of order":    {"5", "1", "10", "0", "", "5:day:UTC:-:0", "0", "2", "1", "3"},
		"cost of 0":             {"5", "0", "10", "0", "", "5:day:UTC:-:0", "0", "1", "2", "3"},
	} {
		cmd := append([]string{"EVAL", luascript.ScriptText("calendar_take.lua"), "3", "k1", "k2", "k3"}, args...)
		if err := e.do(cmd...).Error(); err == nil || !strings.HasPrefix(err.Error(), "INVALID") {
			t.Errorf("%s: %v, want INVALID", name, err)
		}
	}
	if keys, _ := e.do("KEYS", "*").AsStrSlice(); len(keys) != 0 {
		t.Fatalf("refused calls wrote %v", keys)
	}
}

// The periods handed to the script are the zone's, across a change of
// clocks: the day Berlin's clocks go back lasts 25 hours.
func TestCalendarAroundDST(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	c := limits.CalendarWindow{Limit: 1, Period: limits.PeriodDay, TimeZone: "Europe/Berlin"}
	p := luascript.CalendarAround(c, 0, time.Date(2026, 10, 25, 12, 0, 0, 0, berlin))
	want := []time.Time{
		time.Date(2026, 10, 24, 0, 0, 0, 0, berlin), time.Date(2026, 10, 25, 0, 0, 0, 0, berlin),
		time.Date(2026, 10, 26, 0, 0, 0, 0, berlin), time.Date(2026, 10, 27, 0, 0, 0, 0, berlin),
	}
	for i, w := range want {
		if p.Edges[i] != w.UnixMilli() {
			t.Fatalf("edge %d = %v, want %v", i, time.UnixMilli(p.Edges[i]).In(berlin), w)
		}
	}
	if p.Edges[2]-p.Edges[1] != (25 * time.Hour).Milliseconds() {
		t.Fatal("the day is not 25 hours long")
	}
	if p.Starts[1] != p.Edges[1] {
		t.Fatal("without jitter a period's key names its start")
	}
}

// The embedded store runs the calendar scripts too (gopher-lua, its TIME,
// PEXPIREAT), with the same answers.
func TestCalendarOnMiniredis(t *testing.T) {
	_, c := startMiniredis(t)
	prefix := randomPrefix(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, prefix) })
	e := &env{t: t, c: c, prefix: prefix}
	now := time.Now()
	a := e.cal(utcDay, "u", now, 3, "a")
	if r := e.calTake(a); !r.Allowed || r.Used != 3 || r.ResetMS <= 0 {
		t.Fatalf("take = %+v", r)
	}
	if r := e.calTake(a); !r.Replay || r.Used != 3 {
		t.Fatalf("replay = %+v", r)
	}
	a.RequestID = ""
	if r := e.calTake(a); r.Allowed || r.Used != 3 {
		t.Fatalf("take over the limit = %+v", r)
	}
	p, err := luascript.Peek(t.Context(), c, limits.Calendar, luascript.Args{Key: a.Key, Spec: a.Spec, Limit: a.Limit, Periods: a.Periods, Strict: true})
	if err != nil || p.Used != 3 || !p.Exists {
		t.Fatalf("peek = %+v, %v", p, err)
	}
	start, end := utcDay.Bounds(now)
	key := luascript.CalendarPeriodKey(a.Key, start.UnixMilli())
	if ttl := e.pttl(key); ttl <= 0 || ttl > end.Sub(now).Milliseconds()+1000 {
		t.Fatalf("PTTL %s = %d, want until the day's end", key, ttl)
	}
}

func TestCalendarKey(t *testing.T) {
	if got := luascript.CalendarKey("q:", "api", "u"); got != "q:cal:{p:api:u}" {
		t.Fatal(got)
	}
	if got := luascript.CalendarPeriodKey(luascript.CalendarKey("q:", "", "u"), 1764547200000); got != "q:cal:{i:u}:1764547200000" {
		t.Fatal(got)
	}
	if l, ok := luascript.LayoutOf("cal"); !ok || l.Algorithm != limits.Calendar {
		t.Fatalf("layout of cal = %+v, %v", l, ok)
	}
}

// The whole path at instants that matter, on the embedded store, whose
// clock (TIME) a test may set: the script's reset_ms is the time to the
// end of the period holding the store's clock, computed independently
// here with time.Date, across Berlin's changes of clocks, a leap February
// and a week from Sunday, also when the caller's clock is on the other
// side of a boundary.
func TestCalendarAtSetInstants(t *testing.T) {
	m, c := startMiniredis(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name     string
		cal      limits.CalendarWindow
		redis    time.Time     // the store's clock
		skew     time.Duration // the caller's clock minus the store's
		end      time.Time     // the period's end, independently
		startsAt time.Time     // the period's start, which names the key
	}{
		{"a 25-hour day, an hour in", limits.CalendarWindow{Period: "day", TimeZone: "Europe/Berlin"},
			time.Date(2026, 10, 25, 1, 0, 0, 0, berlin), 0,
			time.Date(2026, 10, 26, 0, 0, 0, 0, berlin), time.Date(2026, 10, 25, 0, 0, 0, 0, berlin)},
		{"a 23-hour day, before the change", limits.CalendarWindow{Period: "day", TimeZone: "Europe/Berlin"},
			time.Date(2026, 3, 29, 0, 30, 0, 0, berlin), 0,
			time.Date(2026, 3, 30, 0, 0, 0, 0, berlin), time.Date(2026, 3, 29, 0, 0, 0, 0, berlin)},
		{"a 25-hour day, the caller still in the day before", limits.CalendarWindow{Period: "day", TimeZone: "Europe/Berlin"},
			time.Date(2026, 10, 25, 0, 10, 0, 0, berlin), -20 * time.Minute,
			time.Date(2026, 10, 26, 0, 0, 0, 0, berlin), time.Date(2026, 10, 25, 0, 0, 0, 0, berlin)},
		{"the last minutes of a 23-hour day, the caller in the next", limits.CalendarWindow{Period: "day", TimeZone: "Europe/Berlin"},
			time.Date(2026, 3, 29, 23, 55, 0, 0, berlin), 10 * time.Minute,
			time.Date(2026, 3, 30, 0, 0, 0, 0, berlin), time.Date(2026, 3, 29, 0, 0, 0, 0, berlin)},
		{"a leap february", limits.CalendarWindow{Period: "month", TimeZone: "UTC"},
			time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC), 0,
			time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC)},
		{"a week from sunday, on saturday night", limits.CalendarWindow{Period: "week", TimeZone: "UTC", WeekStart: time.Sunday},
			time.Date(2026, 12, 5, 23, 0, 0, 0, time.UTC), 0,
			time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := randomPrefix(t)
			t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, prefix) })
			e := &env{t: t, c: c, prefix: prefix}
			m.SetTime(tc.redis)
			tc.cal.Limit = 2
			subject := "u" + string(rune('a'+i))
			a := e.cal(tc.cal, subject, tc.redis.Add(tc.skew), 2, "")
			r := e.calTake(a)
			if want := tc.end.Sub(tc.redis).Milliseconds(); !r.Allowed || r.ResetMS != want {
				t.Fatalf("take at %v = %+v, want allowed, reset_ms %d (until %v)", tc.redis, r, want, tc.end)
			}
			key := luascript.CalendarPeriodKey(a.Key, tc.startsAt.UnixMilli())
			if m := e.hash(key); m["used"] != "2" {
				t.Fatalf("%s = %v, want the take counted in the period from %v", key, m, tc.startsAt)
			}
			if r := e.calTake(a); r.Allowed || r.ResetMS != tc.end.Sub(tc.redis).Milliseconds() {
				t.Fatalf("second take = %+v, want denied until %v", r, tc.end)
			}
		})
	}
}

// Every refusal of the calendar take leaves the window as it was (a
// denial included), and the parsers accept only the replies the scripts
// send.
func TestCalendarRefusalsWriteNothing(t *testing.T) {
	e := setup(t)
	now := e.redisNow()
	a := e.cal(utcDay, "u", now, 2, "a")
	a.MaxRequestIDs = 1
	e.calTake(a)
	start, _ := utcDay.Bounds(now)
	key := luascript.CalendarPeriodKey(a.Key, start.UnixMilli())
	before, ttl := e.hash(key), e.pexpiretime(key)
	refuse := func(what string, b luascript.Args, want error) {
		t.Helper()
		if want == nil {
			if r := e.calTake(b); r.Allowed {
				t.Fatalf("%s: %+v, want denied", what, r)
			}
		} else {
			e.calTakeErr(b, want)
		}
		sameHash(t, what, e.hash(key), before)
		if got := e.pexpiretime(key); got != ttl {
			t.Fatalf("%s moved the expiry from %d to %d", what, ttl, got)
		}
	}
	b := a
	b.Cost = 1
	refuse("conflict", b, luascript.ErrConflict)
	b = a
	b.RequestID = "b"
	refuse("request ids full", b, luascript.ErrRequestIDsFull)
	b = a
	b.Strict, b.Spec = true, "5:day:Etc/UTC:-:0"
	refuse("policy", b, luascript.ErrPolicy)
	b = a
	b.RequestID, b.Cost = "", 4
	refuse("denial", b, nil)
	b = e.cal(utcDay, "u", now.Add(-72*time.Hour), 1, "")
	_, err := luascript.Take(t.Context(), e.c, limits.Calendar, b)
	if le := (*luascript.Error)(nil); !errors.As(err, &le) || le.Code != luascript.CodeClockSkew {
		t.Fatalf("skewed take = %v, want CLOCK_SKEW", err)
	}
	sameHash(t, "clock skew", e.hash(key), before)

	reply := func(lua string) rueidis.RedisResult {
		return e.c.Do(t.Context(), e.c.B().Eval().Script(lua).Numkeys(0).Build())
	}
	for _, lua := range []string{"return nil", "return {1, 2, 0, 1000}", "return {2, 2, 0, 1000, 0}", "return {0, 2, 1, 1000, 0}",
		"return {1, -1, 0, 1000, 0}", "return {1, 1, 0, 0, 0, 0}", "return {1, 1, 0, 2764800001, 0}"} {
		if _, err := luascript.ParseTake(reply(lua)); !errors.Is(err, luascript.ErrMalformedReply) {
			t.Errorf("ParseCalendarTake of %q = %v, want MALFORMED_REPLY", lua, err)
		}
	}
	for _, lua := range []string{"return {1, 2}", "return {0, 1, 10}", "return {1, 2, 0}", "return {2, 0, 10}", "return 1"} {
		if _, err := luascript.ParsePeek(reply(lua)); !errors.Is(err, luascript.ErrMalformedReply) {
			t.Errorf("ParseCalendarPeek of %q = %v, want MALFORMED_REPLY", lua, err)
		}
	}
}

// Calendar calls share a batch with the other scripts.
func TestCalendarInExecMulti(t *testing.T) {
	e := setup(t)
	now := e.redisNow()
	take, err := luascript.TakeCall(limits.Calendar, e.cal(utcDay, "u", now, 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	a := e.cal(utcDay, "u", now, 1, "")
	peek, err := luascript.PeekCall(limits.Calendar, luascript.Args{Key: a.Key, Spec: a.Spec, Limit: a.Limit, Periods: a.Periods})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := luascript.TakeCall(limits.FixedWindow, luascript.Args{Key: e.key("u"), Limit: 1, WindowMS: 60000, Cost: 1, MaxRequestIDs: 1})
	if err != nil {
		t.Fatal(err)
	}
	res := luascript.ExecMulti(t.Context(), e.c, []luascript.Call{take, fw, peek})
	if r, err := luascript.ParseTake(res[0]); err != nil || !r.Allowed {
		t.Fatalf("calendar take in a batch = %+v, %v", r, err)
	}
	if r, err := luascript.ParseTake(res[1]); err != nil || !r.Allowed {
		t.Fatalf("fixed window take in a batch = %+v, %v", r, err)
	}
	if p, err := luascript.ParsePeek(res[2]); err != nil || p.Used != 1 {
		t.Fatalf("calendar peek in a batch = %+v, %v", p, err)
	}
}

// A period counted from the epoch (the windows of Envoy's rate limit
// service) is a calendar period whose length the spec names: a year of
// 365 days is longer than any wall-clock period, and its spec holds
// digits. Periods of days, so that none ends during the test. Its window is counted, denied and peeked as any calendar's.
func TestCalendarEpochPeriods(t *testing.T) {
	e := setup(t)
	for _, w := range []limits.CalendarWindow{limits.EpochWindow(2, 7*86_400), limits.EpochWindow(2, 365*86_400)} {
		before := e.redisNow()
		start, end := w.Bounds(before)
		a := e.cal(w, "epoch", before, 2, "")
		key := luascript.CalendarPeriodKey(a.Key, start.UnixMilli())
		r := e.calTake(a)
		if !r.Allowed || r.Used != 2 || r.ResetMS > end.Sub(before).Milliseconds()+1 {
			t.Fatalf("%s: take = %+v, want allowed at used 2, reset by %v", w.Spec(), r, end)
		}
		sameHash(t, w.Spec(), e.hash(key), map[string]string{"used": "2", "policy": w.Spec(), "ids": "0"})
		if r := e.calTake(a); r.Allowed || r.Used != 2 {
			t.Fatalf("%s: take over the limit = %+v, want denied", w.Spec(), r)
		}
	}
}

// A give back lowers the use of the period holding Redis's clock, never
// below zero, creates no window, and gives back again when sent again.
func TestCalendarGive(t *testing.T) {
	e := setup(t)
	w := limits.EpochWindow(5, 7*86_400)
	now := e.redisNow()
	a := e.cal(w, "give", now, 4, "")
	give := func(cost int64) luascript.Result {
		t.Helper()
		g := a
		g.Cost = cost
		call, err := luascript.CalendarGiveCall(g)
		if err != nil {
			t.Fatal(err)
		}
		r, err := luascript.ParsePeek(call.Exec(t.Context(), e.c))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := give(2); r.Exists || r.Used != 0 || r.Remaining != 5 {
		t.Fatalf("give back without a window = %+v, want none, 5 remaining", r)
	}
	start, _ := w.Bounds(now)
	if n, _ := e.do("EXISTS", luascript.CalendarPeriodKey(a.Key, start.UnixMilli())).AsInt64(); n != 0 {
		t.Fatal("a give back created a window")
	}
	e.calTake(a)
	if r := give(1); !r.Exists || r.Used != 3 || r.Remaining != 2 {
		t.Fatalf("give back 1 of 4 = %+v, want used 3", r)
	}
	if r := give(1); r.Used != 2 {
		t.Fatalf("the same give back again = %+v, want used 2: it is not idempotent", r)
	}
	if r := give(10); r.Used != 0 || r.Remaining != 5 {
		t.Fatalf("give back above the use = %+v, want used 0", r)
	}
	bad := a
	bad.Cost = 0
	if _, err := luascript.CalendarGiveCall(bad); !errors.Is(err, luascript.ErrInvalid) {
		t.Fatalf("cost 0: %v, want INVALID", err)
	}
}
