package limits

import (
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	// The zone database is in the binary, so a zone name means the same
	// rules on every machine that has no zoneinfo of its own (a scratch or
	// distroless image) and never fails for want of one.
	_ "time/tzdata"
)

// CalendarWindow is a fixed window aligned to the calendar: Limit units per
// Period (minute, hour, day, week or month) of the wall clock in TimeZone,
// weeks starting on WeekStart. JitterMS, when not 0, moves every boundary
// of one subject later by the same amount, from 0 to JitterMS - 1 ms,
// hashed from the subject, so that subjects do not all reset at once.
//
// Periods are runs of the wall clock: a day is every instant whose local
// date is the same, from the first such instant to the first of the next
// date. So a day in Europe/Berlin lasts 23 hours when clocks go forward
// and 25 when they go back, a month lasts 28 to 31 days (and an hour or
// so more or less across a change), and a local midnight that does not
// exist starts its day at the first instant that does.
//
// PeriodEpoch is the one period that is not the wall clock's: periods of
// EpochSeconds each, counted from the Unix epoch (1970-01-01T00:00:00Z),
// the windows of Envoy's rate limit service (rls/). Only Go sets it: the
// protocol and the policy file cannot name it (Validate refuses it without
// EpochSeconds), and its TimeZone is UTC, its jitter 0.
type CalendarWindow struct {
	Limit     int64
	Period    string
	TimeZone  string // an IANA zone name; "" is not a zone, use "UTC"
	WeekStart time.Weekday
	JitterMS  int64
	// EpochSeconds is the length of a PeriodEpoch period, in seconds,
	// 1..MaxEpochSeconds; 0 for every other period.
	EpochSeconds int64
}

// Calendar is the calendar window's algorithm name.
const Calendar = "calendar"

// Periods a calendar window may count.
const (
	PeriodMinute = "minute"
	PeriodHour   = "hour"
	PeriodDay    = "day"
	PeriodWeek   = "week"
	PeriodMonth  = "month"
	// PeriodEpoch: every EpochSeconds from the Unix epoch.
	PeriodEpoch = "epoch"
)

// MaxEpochSeconds bounds a PeriodEpoch period: ten years of 365 days. A
// window's key lives as long as its period, and the period before the one
// holding the clock must start after 1970.
const MaxEpochSeconds = 10 * 365 * 86_400

// EpochWindow is Limit per period of seconds counted from the Unix epoch.
func EpochWindow(limit, seconds int64) CalendarWindow {
	return CalendarWindow{Limit: limit, Period: PeriodEpoch, TimeZone: DefaultTimeZone, WeekStart: DefaultWeekStart, EpochSeconds: seconds}
}

// Calendar defaults.
const (
	DefaultTimeZone  = "UTC"
	DefaultWeekStart = time.Monday
)

// periodJitterMax is the bound of each period's jitter: jitter_ms must be
// below it, the shortest the period can be without a zone change (28 days
// for a month).
var periodJitterMax = map[string]int64{
	PeriodMinute: 60_000,
	PeriodHour:   3_600_000,
	PeriodDay:    86_400_000,
	PeriodWeek:   7 * 86_400_000,
	PeriodMonth:  28 * 86_400_000,
}

// PeriodRule and WeekStartRule are how messages describe valid values.
const (
	PeriodRule    = "period must be one of minute, hour, day, week, month"
	WeekStartRule = "week_start must be a day of the week in lower case: monday, tuesday, ..., sunday"
)

func (CalendarWindow) Algorithm() string { return Calendar }
func (c CalendarWindow) Quota() int64    { return c.Limit }

// Validate reports the first field out of bounds: limit, period, time_zone,
// week_start, jitter_ms.
func (c CalendarWindow) Validate() error {
	if err := ValidateLimit("limit", c.Limit); err != nil {
		return err
	}
	if c.Period == PeriodEpoch || c.EpochSeconds != 0 {
		return c.validateEpoch()
	}
	jmax, ok := periodJitterMax[c.Period]
	if !ok {
		return &Error{Field: "period", Message: PeriodRule}
	}
	if _, err := LoadZone(c.TimeZone); err != nil {
		return err
	}
	if c.WeekStart < time.Sunday || c.WeekStart > time.Saturday {
		return &Error{Field: "week_start", Message: WeekStartRule}
	}
	if c.JitterMS < 0 || c.JitterMS >= jmax {
		return &Error{Field: "jitter_ms", Message: "jitter_ms must be an integer from 0 to " +
			strconv.FormatInt(jmax-1, 10) + " (less than one " + c.Period + ")"}
	}
	return nil
}

// validateEpoch checks a PeriodEpoch window's fields beside its limit.
func (c CalendarWindow) validateEpoch() error {
	switch {
	case c.Period != PeriodEpoch || c.EpochSeconds == 0:
		return &Error{Field: "period", Message: PeriodRule}
	case c.EpochSeconds < 1 || c.EpochSeconds > MaxEpochSeconds:
		return outOfRange("period", 1, MaxEpochSeconds, " seconds (ten years of 365 days)")
	case c.TimeZone != DefaultTimeZone || c.JitterMS != 0:
		return &Error{Field: "period", Message: "a period counted from the epoch is in UTC, without jitter"}
	}
	return nil
}

// Spec is the calendar's limits as one string, "<limit>:<period>:<zone>:
// <week_start>:<jitter_ms>", recorded in a window so that inline limits
// that differ are told apart (POLICY). week_start is that of a week
// period, and "-" for the others, which it does not change. A PeriodEpoch
// period is written with its length, "epoch<seconds>".
func (c CalendarWindow) Spec() string {
	if c.Period == PeriodEpoch {
		return strconv.FormatInt(c.Limit, 10) + ":" + PeriodEpoch + strconv.FormatInt(c.EpochSeconds, 10) + ":" + c.TimeZone + ":-:" +
			strconv.FormatInt(c.JitterMS, 10)
	}
	ws := "-"
	if c.Period == PeriodWeek {
		ws = WeekdayName(c.WeekStart)
	}
	return strconv.FormatInt(c.Limit, 10) + ":" + c.Period + ":" + c.TimeZone + ":" + ws + ":" + strconv.FormatInt(c.JitterMS, 10)
}

// ParseCalendarSpec reads what Spec wrote, for tools that read windows
// (quotad doctor); ok is false unless s is a valid calendar's Spec.
func ParseCalendarSpec(s string) (c CalendarWindow, ok bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 5 {
		return c, false
	}
	limit, err1 := strconv.ParseInt(parts[0], 10, 64)
	jitter, err2 := strconv.ParseInt(parts[4], 10, 64)
	if err1 != nil || err2 != nil {
		return c, false
	}
	c = CalendarWindow{Limit: limit, Period: parts[1], TimeZone: parts[2], WeekStart: DefaultWeekStart, JitterMS: jitter}
	if n, found := strings.CutPrefix(parts[1], PeriodEpoch); found {
		secs, err := strconv.ParseInt(n, 10, 64)
		if err != nil || parts[3] != "-" {
			return c, false
		}
		c.Period, c.EpochSeconds = PeriodEpoch, secs
		return c, c.Validate() == nil && c.Spec() == s
	}
	if parts[3] != "-" {
		if c.WeekStart, ok = ParseWeekday(parts[3]); !ok || c.Period != PeriodWeek {
			return c, false
		}
	}
	return c, c.Validate() == nil && c.Spec() == s
}

// ParseWeekday reads a week_start: "monday" to "sunday".
func ParseWeekday(s string) (time.Weekday, bool) {
	for d := time.Sunday; d <= time.Saturday; d++ {
		if WeekdayName(d) == s {
			return d, true
		}
	}
	return 0, false
}

// WeekdayName is d as week_start spells it: "monday".
func WeekdayName(d time.Weekday) string {
	return [...]string{"sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"}[d]
}

// maxZoneBytes bounds a zone name; the longest IANA name is 32 bytes.
const maxZoneBytes = 64

// zones caches loaded locations by name, so a zone is read from the
// database once per process, not once per request. Only names that load
// are kept, so the cache holds at most the database's few hundred zones.
var zones sync.Map // string -> *time.Location

// badZones remembers up to maxBadZones names that did not load, so a
// client repeating a bad name costs a map lookup, not a search of the zone
// database (tens of µs) per request.
var (
	badZones     sync.Map // string -> struct{}
	badZoneCount atomic.Int64
)

const maxBadZones = 1024

// LoadZone returns the location of an IANA zone name ("Asia/Shanghai",
// "UTC"), from a cache after the first time. "" and "Local" are refused:
// a limit must mean the same on every machine.
func LoadZone(name string) (*time.Location, error) {
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location), nil
	}
	bad := &Error{Field: "time_zone", Message: "time_zone must be an IANA zone name such as UTC or Europe/Berlin, got " +
		strconv.Quote(truncate(name, maxZoneBytes))}
	if name == "" || name == "Local" || len(name) > maxZoneBytes {
		return nil, bad
	}
	if _, known := badZones.Load(name); known {
		return nil, bad
	}
	for i := 0; i < len(name); i++ {
		// The characters of IANA names; also keeps ':' out of Spec.
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '/', c == '_', c == '-', c == '+':
		default:
			return nil, bad
		}
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		if badZoneCount.Add(1) <= maxBadZones {
			badZones.Store(name, struct{}{})
		}
		return nil, bad
	}
	zones.Store(name, l)
	return l, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Offset is the subject's jitter: how much later than the calendar's its
// boundaries fall, from 0 to JitterMS - 1 ms, the same in every process
// (FNV-1a of the subject).
func (c CalendarWindow) Offset(subject string) time.Duration {
	if c.JitterMS <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(subject))
	return time.Duration(h.Sum64()%uint64(c.JitterMS)) * time.Millisecond
}

// Bounds returns the period of the calendar (without jitter) that holds t:
// start <= t < end. The calendar must have passed Validate.
func (c CalendarWindow) Bounds(t time.Time) (start, end time.Time) {
	if c.Period == PeriodEpoch {
		ms := c.EpochSeconds * 1000
		s := t.UnixMilli() / ms * ms
		return time.UnixMilli(s).UTC(), time.UnixMilli(s + ms).UTC()
	}
	loc, err := LoadZone(c.TimeZone)
	if err != nil {
		loc = time.UTC
	}
	t = t.In(loc)
	label := c.label(t)
	// Within one zone segment (a constant offset) the wall clock is t plus
	// the offset, so the label's run is plain arithmetic; at a segment's
	// edge the run goes on into the next segment while the label is the
	// same. Bounded: a month meets a handful of changes at most.
	start = t
	for range 64 {
		zs, _ := start.ZoneBounds()
		_, off := start.Zone()
		u := time.Unix(label-int64(off), 0).In(loc)
		if zs.IsZero() || u.After(zs) {
			start = u
			break
		}
		if prev := zs.Add(-time.Nanosecond); c.label(prev) == label {
			start = prev
			continue
		}
		start = zs
		break
	}
	next := c.nextLabel(label)
	end = t
	for range 64 {
		ze := segmentEnd(end)
		_, off := end.Zone()
		u := time.Unix(next-int64(off), 0).In(loc)
		if ze.IsZero() || u.Before(ze) {
			end = u
			break
		}
		if c.label(ze) == label {
			end = ze
			continue
		}
		end = ze
		break
	}
	return start, end
}

// segmentEnd is when the zone segment holding x ends (zero: never).
// Past the zone table's last entry Go computes segments from the zone's
// rule one year at a time, and may end the last one of a leap year a day
// early, before x itself: that segment runs on into the next year, whose
// first segment's end is then the one wanted.
func segmentEnd(x time.Time) time.Time {
	_, ze := x.ZoneBounds()
	if !ze.IsZero() && !ze.After(x) {
		_, ze = x.Add(48 * time.Hour).ZoneBounds()
	}
	return ze
}

// label is the period holding t (in the calendar's zone) named by the
// wall clock at its start, as seconds since 1970 of that wall clock read
// as UTC.
func (c CalendarWindow) label(t time.Time) int64 {
	y, mo, d := t.Date()
	var w time.Time
	switch c.Period {
	case PeriodMinute:
		w = time.Date(y, mo, d, t.Hour(), t.Minute(), 0, 0, time.UTC)
	case PeriodHour:
		w = time.Date(y, mo, d, t.Hour(), 0, 0, 0, time.UTC)
	case PeriodWeek:
		back := (int(t.Weekday()) - int(c.WeekStart) + 7) % 7
		w = time.Date(y, mo, d-back, 0, 0, 0, 0, time.UTC)
	case PeriodMonth:
		w = time.Date(y, mo, 1, 0, 0, 0, 0, time.UTC)
	default:
		w = time.Date(y, mo, d, 0, 0, 0, 0, time.UTC)
	}
	return w.Unix()
}

// nextLabel is the label of the period after the one labelled label.
func (c CalendarWindow) nextLabel(label int64) int64 {
	w := time.Unix(label, 0).UTC()
	switch c.Period {
	case PeriodMinute:
		return label + 60
	case PeriodHour:
		return label + 3600
	case PeriodWeek:
		return w.AddDate(0, 0, 7).Unix()
	case PeriodMonth:
		return w.AddDate(0, 1, 0).Unix()
	}
	return w.AddDate(0, 0, 1).Unix()
}
