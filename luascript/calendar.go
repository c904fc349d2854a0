package luascript

import (
	"context"
	_ "embed"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"quotad/limits"
)

var (
	//go:embed calendar_take.lua
	calendarTakeBody string
	//go:embed calendar_peek.lua
	calendarPeekBody string

	calendarTake = newScript("calendar_take.lua", calendarTakeBody)
	calendarPeek = newScript("calendar_peek.lua", calendarPeekBody)
)

// CodeClockSkew starts the reply of a calendar script that found Redis's
// clock outside the three periods the caller computed around its own: the
// caller's clock is more than a period away from Redis's. Nothing was
// written. It is an *Error: Redis answered, and is healthy.
const CodeClockSkew = "CLOCK_SKEW"

// maxPeriodMS bounds a calendar period, as the scripts do: a month of 31
// days and a zone change.
const maxPeriodMS = 32 * 86_400_000

// CalendarPeriods are three consecutive periods of a calendar window: the
// one holding the caller's clock, the one before it and the one after it.
// Period i runs from Edges[i] to Edges[i+1], ms since 1970, jitter
// included; Starts[i] is its start without jitter, which names its key.
type CalendarPeriods struct {
	Starts [3]int64
	Edges  [4]int64
}

// CalendarAround computes the periods of c around now, for a subject
// whose boundaries fall offset late (CalendarWindow.Offset). c must have
// passed Validate.
func CalendarAround(c limits.CalendarWindow, offset time.Duration, now time.Time) CalendarPeriods {
	s1, e1 := c.Bounds(now.Add(-offset))
	s0, _ := c.Bounds(s1.Add(-time.Nanosecond))
	_, e2 := c.Bounds(e1)
	var p CalendarPeriods
	for i, t := range []time.Time{s0, s1, e1} {
		p.Starts[i] = t.UnixMilli()
	}
	for i, t := range []time.Time{s0, s1, e1, e2} {
		p.Edges[i] = t.Add(offset).UnixMilli()
	}
	return p
}

// CalendarPeriodKey is the key of the window that counts the period
// starting at startMS, of the subject whose CalendarKey is key:
// "<key>:<start ms>". It shares key's hash tag, so a subject's periods
// live on one Cluster slot.
func CalendarPeriodKey(key string, startMS int64) string {
	return key + ":" + strconv.FormatInt(startMS, 10)
}

// CalendarArgs is one decision on a calendar window.
type CalendarArgs struct {
	// Key is the subject's CalendarKey; each period's window is a key of
	// its own (CalendarPeriodKey).
	Key string
	// Spec is CalendarWindow.Spec of the limits, recorded in the window.
	Spec    string
	Limit   int64
	Periods CalendarPeriods
	Cost    int64 // 1..Limit
	// RequestID makes the take idempotent within its period: "" for none.
	RequestID string
	// Strict is for inline limits: a live window recorded under another
	// Spec is ErrPolicy. A named policy's new limits apply at once.
	Strict        bool
	MaxRequestIDs int64 // 1..MaxRequestIDsSize
}

// CalendarResult is the decision.
type CalendarResult struct {
	Allowed bool
	// Replay: RequestID was already accepted in this period with the same
	// cost; nothing was consumed.
	Replay bool
	// Used after this decision; for a replay, right after the original
	// acceptance.
	Used int64
	// ResetMS is until the end of the period, by Redis's clock.
	ResetMS int64
	// Healed: the window had no TTL and was given its period's end.
	Healed bool
}

// CalendarTake makes one atomic decision on the calendar window of the
// period holding Redis's clock. A denial writes nothing. Errors are as
// for FixedWindowTake, plus an *Error of CodeClockSkew.
func CalendarTake(ctx context.Context, c rueidis.Client, a CalendarArgs) (CalendarResult, error) {
	call, err := CalendarTakeCall(a)
	if err != nil {
		return CalendarResult{}, err
	}
	r, err := ParseCalendarTake(call.Exec(ctx, c))
	if err == nil && r.Used > a.Limit && !r.Replay && r.Allowed {
		return CalendarResult{}, malformed("calendar take", "used %d above the limit %d", r.Used, a.Limit)
	}
	return r, err
}

func (a CalendarArgs) keys() []string {
	k := make([]string, 3)
	for i, s := range a.Periods.Starts {
		k[i] = CalendarPeriodKey(a.Key, s)
	}
	return k
}

func edgeArgs(p CalendarPeriods) []string {
	s := make([]string, 4)
	for i, e := range p.Edges {
		s[i] = strconv.FormatInt(e, 10)
	}
	return s
}

// CalendarTakeCall validates a calendar take and builds its script call;
// ParseCalendarTake reads the result.
func CalendarTakeCall(a CalendarArgs) (Call, error) {
	if err := validateCalendar(a.Key, a.Limit, a.Spec, a.Periods); err != nil {
		return Call{}, err
	}
	if a.Cost < 1 || a.Cost > a.Limit {
		return Call{}, &Error{Code: CodeInvalid, Message: "cost must be an integer from 1 to the limit"}
	}
	if err := limits.ValidateMaxRequestIDs(a.MaxRequestIDs); err != nil {
		return Call{}, invalid(err)
	}
	if err := checkRequestID(a.RequestID, false); err != nil {
		return Call{}, err
	}
	return Call{s: calendarTake, keys: a.keys(), args: append([]string{
		decimal(a.Limit),
		strconv.FormatInt(a.Cost, 10),
		decimal(a.MaxRequestIDs),
		flag(a.Strict),
		a.RequestID,
		a.Spec,
	}, edgeArgs(a.Periods)...)}, nil
}

// ParseCalendarTake reads the result of a calendar take's call.
func ParseCalendarTake(res rueidis.RedisResult) (CalendarResult, error) {
	const op = "calendar take"
	if err := res.Error(); err != nil {
		return CalendarResult{}, replyError(op, err)
	}
	var v [5]int64
	if err := ints(op, res, v[:]); err != nil {
		return CalendarResult{}, err
	}
	allowed, used, replay, reset, healed := v[0], v[1], v[2], v[3], v[4]
	if !isFlag(allowed) || !isFlag(replay) || !isFlag(healed) || replay > allowed || used < 0 || used > MaxLimit ||
		reset < 1 || reset > maxPeriodMS {
		return CalendarResult{}, malformed(op, "reply %v", v)
	}
	return CalendarResult{Allowed: allowed == 1, Replay: replay == 1, Used: used, ResetMS: reset, Healed: healed == 1}, nil
}

// CalendarPeekArgs names a calendar window to read.
type CalendarPeekArgs struct {
	Key     string
	Spec    string
	Limit   int64
	Periods CalendarPeriods
	Strict  bool
}

// CalendarPeekResult is the state of the period holding Redis's clock.
type CalendarPeekResult struct {
	Exists  bool
	Used    int64
	ResetMS int64 // until the period's end, window or not
}

// CalendarPeek reads the calendar window of the period holding Redis's
// clock without writing anything.
func CalendarPeek(ctx context.Context, c rueidis.Client, a CalendarPeekArgs) (CalendarPeekResult, error) {
	call, err := CalendarPeekCall(a)
	if err != nil {
		return CalendarPeekResult{}, err
	}
	return ParseCalendarPeek(call.Exec(ctx, c))
}

// CalendarPeekCall validates a calendar peek and builds its script call;
// ParseCalendarPeek reads the result.
func CalendarPeekCall(a CalendarPeekArgs) (Call, error) {
	if err := validateCalendar(a.Key, a.Limit, a.Spec, a.Periods); err != nil {
		return Call{}, err
	}
	args := CalendarArgs{Key: a.Key, Periods: a.Periods}
	return Call{s: calendarPeek, keys: args.keys(), args: append([]string{
		decimal(a.Limit), flag(a.Strict), a.Spec,
	}, edgeArgs(a.Periods)...)}, nil
}

// ParseCalendarPeek reads the result of a calendar peek's call.
func ParseCalendarPeek(res rueidis.RedisResult) (CalendarPeekResult, error) {
	const op = "calendar peek"
	if err := res.Error(); err != nil {
		return CalendarPeekResult{}, replyError(op, err)
	}
	var v [3]int64
	if err := ints(op, res, v[:]); err != nil {
		return CalendarPeekResult{}, err
	}
	exists, used, reset := v[0], v[1], v[2]
	if !isFlag(exists) || used < 0 || used > MaxLimit || (exists == 0 && used != 0) || reset < 1 || reset > maxPeriodMS {
		return CalendarPeekResult{}, malformed(op, "reply %v", v)
	}
	return CalendarPeekResult{Exists: exists == 1, Used: used, ResetMS: reset}, nil
}

func validateCalendar(key string, limit int64, spec string, p CalendarPeriods) error {
	if key == "" {
		return errEmptyKey
	}
	if err := limits.ValidateLimit("limit", limit); err != nil {
		return invalid(err)
	}
	if spec == "" || len(spec) > 128 {
		return &Error{Code: CodeInvalid, Message: "spec must be limit:period:zone:week_start:jitter_ms"}
	}
	for i := 1; i < 4; i++ {
		if d := p.Edges[i] - p.Edges[i-1]; d <= 0 || d > maxPeriodMS {
			return &Error{Code: CodeInvalid, Message: "calendar periods must be increasing and at most 32 days each"}
		}
	}
	if p.Edges[0] < 0 {
		return &Error{Code: CodeInvalid, Message: "calendar periods must start after 1970"}
	}
	return nil
}
