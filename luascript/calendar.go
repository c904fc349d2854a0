package luascript

import (
	_ "embed"
	"strconv"
	"time"

	"quotad/limits"
)

// CodeClockSkew starts the reply of a calendar script that found Redis's
// clock outside the three periods the caller computed around its own: the
// caller's clock is more than a period away from Redis's. Nothing was
// written. It is an *Error: Redis answered, and is healthy.
const CodeClockSkew = "CLOCK_SKEW"

// maxPeriodMS bounds a calendar period, as the scripts do: the longest
// period counted from the epoch (limits.MaxEpochSeconds), far above a
// month of 31 days and a zone change. Go computes the edges; the bound only
// keeps a caller's arithmetic error from making a window that never ends.
const maxPeriodMS = limits.MaxEpochSeconds * 1000

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

// checkCalendar checks a calendar window's limits and periods, as the
// scripts do.
func checkCalendar(a *Args) error {
	spec, p := a.Spec, a.Periods
	if err := limits.ValidateLimit("limit", a.Limit); err != nil {
		return invalid(err)
	}
	if spec == "" || len(spec) > 128 {
		return &Error{Code: CodeInvalid, Message: "spec must be limit:period:zone:week_start:jitter_ms"}
	}
	for i := 1; i < 4; i++ {
		if d := p.Edges[i] - p.Edges[i-1]; d <= 0 || d > maxPeriodMS {
			return &Error{Code: CodeInvalid, Message: "calendar periods must be increasing and at most " + strconv.FormatInt(maxPeriodMS, 10) + " ms each"}
		}
	}
	if p.Edges[0] < 0 {
		return &Error{Code: CodeInvalid, Message: "calendar periods must start after 1970"}
	}
	return nil
}
