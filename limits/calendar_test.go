package limits

import (
	"errors"
	"testing"
	"time"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	l, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Every expected instant below is written as a wall clock through
// time.Date, independently of Bounds's segment walk.
func TestCalendarBounds(t *testing.T) {
	berlin, shanghai := zone(t, "Europe/Berlin"), zone(t, "Asia/Shanghai")
	kolkata, havana := zone(t, "Asia/Kolkata"), zone(t, "America/Havana")
	for _, c := range []struct {
		name       string
		cal        CalendarWindow
		at         time.Time
		start, end time.Time
		length     time.Duration // 0: not checked
	}{
		{"berlin day of 23 hours", CalendarWindow{Period: PeriodDay, TimeZone: "Europe/Berlin"},
			time.Date(2026, 3, 29, 12, 0, 0, 0, berlin),
			time.Date(2026, 3, 29, 0, 0, 0, 0, berlin), time.Date(2026, 3, 30, 0, 0, 0, 0, berlin), 23 * time.Hour},
		{"berlin day of 25 hours", CalendarWindow{Period: PeriodDay, TimeZone: "Europe/Berlin"},
			time.Date(2026, 10, 25, 23, 59, 0, 0, berlin),
			time.Date(2026, 10, 25, 0, 0, 0, 0, berlin), time.Date(2026, 10, 26, 0, 0, 0, 0, berlin), 25 * time.Hour},
		{"berlin day of 24 hours", CalendarWindow{Period: PeriodDay, TimeZone: "Europe/Berlin"},
			time.Date(2026, 3, 28, 0, 0, 0, 0, berlin),
			time.Date(2026, 3, 28, 0, 0, 0, 0, berlin), time.Date(2026, 3, 29, 0, 0, 0, 0, berlin), 24 * time.Hour},
		// Past the zone table Go computes changes from the zone's rule.
		{"berlin day of 23 hours in 2040", CalendarWindow{Period: PeriodDay, TimeZone: "Europe/Berlin"},
			time.Date(2040, 3, 25, 12, 0, 0, 0, berlin),
			time.Date(2040, 3, 25, 0, 0, 0, 0, berlin), time.Date(2040, 3, 26, 0, 0, 0, 0, berlin), 23 * time.Hour},
		{"berlin new year after a leap year", CalendarWindow{Period: PeriodDay, TimeZone: "Europe/Berlin"},
			time.Date(2041, 1, 1, 0, 30, 0, 0, berlin),
			time.Date(2041, 1, 1, 0, 0, 0, 0, berlin), time.Date(2041, 1, 2, 0, 0, 0, 0, berlin), 24 * time.Hour},
		{"shanghai day", CalendarWindow{Period: PeriodDay, TimeZone: "Asia/Shanghai"},
			time.Date(2026, 12, 1, 23, 59, 59, 999e6, shanghai),
			time.Date(2026, 12, 1, 0, 0, 0, 0, shanghai), time.Date(2026, 12, 2, 0, 0, 0, 0, shanghai), 24 * time.Hour},
		{"utc day ends at midnight exactly", CalendarWindow{Period: PeriodDay, TimeZone: "UTC"},
			time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC),
			time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC), 24 * time.Hour},
		{"february of 28 days", CalendarWindow{Period: PeriodMonth, TimeZone: "UTC"},
			time.Date(2026, 2, 14, 0, 0, 0, 0, time.UTC),
			time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), 28 * 24 * time.Hour},
		{"february of 29 days", CalendarWindow{Period: PeriodMonth, TimeZone: "UTC"},
			time.Date(2028, 2, 29, 23, 0, 0, 0, time.UTC),
			time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), 29 * 24 * time.Hour},
		{"april of 30 days", CalendarWindow{Period: PeriodMonth, TimeZone: "Asia/Shanghai"},
			time.Date(2026, 4, 1, 0, 0, 0, 0, shanghai),
			time.Date(2026, 4, 1, 0, 0, 0, 0, shanghai), time.Date(2026, 5, 1, 0, 0, 0, 0, shanghai), 30 * 24 * time.Hour},
		{"december of 31 days", CalendarWindow{Period: PeriodMonth, TimeZone: "UTC"},
			time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC),
			time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), 31 * 24 * time.Hour},
		{"berlin march, one hour short", CalendarWindow{Period: PeriodMonth, TimeZone: "Europe/Berlin"},
			time.Date(2026, 3, 31, 23, 0, 0, 0, berlin),
			time.Date(2026, 3, 1, 0, 0, 0, 0, berlin), time.Date(2026, 4, 1, 0, 0, 0, 0, berlin), 31*24*time.Hour - time.Hour},
		{"week from monday", CalendarWindow{Period: PeriodWeek, TimeZone: "UTC", WeekStart: time.Monday},
			time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC), // a Sunday
			time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC), 7 * 24 * time.Hour},
		{"week from sunday", CalendarWindow{Period: PeriodWeek, TimeZone: "UTC", WeekStart: time.Sunday},
			time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC),
			time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 13, 0, 0, 0, 0, time.UTC), 7 * 24 * time.Hour},
		{"week from saturday across a month", CalendarWindow{Period: PeriodWeek, TimeZone: "Asia/Shanghai", WeekStart: time.Saturday},
			time.Date(2026, 12, 1, 9, 0, 0, 0, shanghai), // a Tuesday
			time.Date(2026, 11, 28, 0, 0, 0, 0, shanghai), time.Date(2026, 12, 5, 0, 0, 0, 0, shanghai), 7 * 24 * time.Hour},
		{"berlin week holding the 25-hour day", CalendarWindow{Period: PeriodWeek, TimeZone: "Europe/Berlin", WeekStart: time.Monday},
			time.Date(2026, 10, 21, 0, 0, 0, 0, berlin),
			time.Date(2026, 10, 19, 0, 0, 0, 0, berlin), time.Date(2026, 10, 26, 0, 0, 0, 0, berlin), 7*24*time.Hour + time.Hour},
		{"hour in a half-hour zone", CalendarWindow{Period: PeriodHour, TimeZone: "Asia/Kolkata"},
			time.Date(2026, 12, 1, 10, 59, 0, 0, kolkata),
			time.Date(2026, 12, 1, 10, 0, 0, 0, kolkata), time.Date(2026, 12, 1, 11, 0, 0, 0, kolkata), time.Hour},
		// Berlin's clock shows 02:00 to 03:00 twice that night: one hour
		// period of two hours, from 00:00 to 02:00 UTC.
		{"an hour the clock repeats", CalendarWindow{Period: PeriodHour, TimeZone: "Europe/Berlin"},
			time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC),
			time.Date(2026, 10, 25, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 25, 2, 0, 0, 0, time.UTC), 2 * time.Hour},
		{"the hour before a skipped one", CalendarWindow{Period: PeriodHour, TimeZone: "Europe/Berlin"},
			time.Date(2026, 3, 29, 1, 30, 0, 0, berlin),
			time.Date(2026, 3, 29, 1, 0, 0, 0, berlin), time.Date(2026, 3, 29, 3, 0, 0, 0, berlin), time.Hour},
		{"minute", CalendarWindow{Period: PeriodMinute, TimeZone: "Asia/Kolkata"},
			time.Date(2026, 12, 1, 10, 59, 30, 0, kolkata),
			time.Date(2026, 12, 1, 10, 59, 0, 0, kolkata), time.Date(2026, 12, 1, 11, 0, 0, 0, kolkata), time.Minute},
		// Havana moves from 00:00 to 01:00: that day starts at 01:00.
		{"a midnight that does not exist", CalendarWindow{Period: PeriodDay, TimeZone: "America/Havana"},
			time.Date(2026, 3, 8, 12, 0, 0, 0, havana),
			time.Date(2026, 3, 8, 1, 0, 0, 0, havana), time.Date(2026, 3, 9, 0, 0, 0, 0, havana), 23 * time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cal.Limit = 1
			if err := c.cal.Validate(); err != nil {
				t.Fatal(err)
			}
			s, e := c.cal.Bounds(c.at)
			if !s.Equal(c.start) || !e.Equal(c.end) {
				t.Fatalf("Bounds(%v) = %v .. %v, want %v .. %v", c.at, s, e, c.start, c.end)
			}
			if c.length != 0 && e.Sub(s) != c.length {
				t.Fatalf("period lasts %v, want %v", e.Sub(s), c.length)
			}
			// The period's last instant and its first give the same bounds,
			// and the next period starts where this one ends.
			for _, at := range []time.Time{s, e.Add(-time.Nanosecond)} {
				if s2, e2 := c.cal.Bounds(at); !s2.Equal(s) || !e2.Equal(e) {
					t.Fatalf("Bounds(%v) = %v .. %v, want the same period", at, s2, e2)
				}
			}
			if s2, _ := c.cal.Bounds(e); !s2.Equal(e) {
				t.Fatalf("the next period starts at %v, want %v", s2, e)
			}
		})
	}
}

// Consecutive periods tile time with no gap or overlap, through a year of
// Berlin's changes, for every period.
func TestCalendarPeriodsTile(t *testing.T) {
	for _, p := range []string{PeriodHour, PeriodDay, PeriodWeek, PeriodMonth} {
		c := CalendarWindow{Limit: 1, Period: p, TimeZone: "Europe/Berlin", WeekStart: time.Wednesday}
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		s, e := c.Bounds(at)
		for range 24 * 366 * 16 / map[string]int{PeriodHour: 1, PeriodDay: 24, PeriodWeek: 168, PeriodMonth: 720}[p] {
			if !e.After(s) {
				t.Fatalf("%s: empty period %v .. %v", p, s, e)
			}
			s2, e2 := c.Bounds(e)
			if !s2.Equal(e) {
				t.Fatalf("%s: after %v .. %v the next period starts at %v", p, s, e, s2)
			}
			s, e = s2, e2
		}
	}
}

func TestCalendarCheck(t *testing.T) {
	ok := CalendarWindow{Limit: 10, Period: PeriodDay, TimeZone: "Asia/Shanghai", WeekStart: time.Monday}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod   func(*CalendarWindow)
		field string
	}{
		{func(c *CalendarWindow) { c.Limit = 0 }, "limit"},
		{func(c *CalendarWindow) { c.Period = "fortnight" }, "period"},
		{func(c *CalendarWindow) { c.TimeZone = "Mars/Olympus" }, "time_zone"},
		{func(c *CalendarWindow) { c.TimeZone = "" }, "time_zone"},
		{func(c *CalendarWindow) { c.TimeZone = "Local" }, "time_zone"},
		{func(c *CalendarWindow) { c.TimeZone = "../../etc/passwd" }, "time_zone"},
		{func(c *CalendarWindow) { c.WeekStart = 7 }, "week_start"},
		{func(c *CalendarWindow) { c.JitterMS = -1 }, "jitter_ms"},
		{func(c *CalendarWindow) { c.JitterMS = 86_400_000 }, "jitter_ms"},
		{func(c *CalendarWindow) { c.Period, c.JitterMS = PeriodMinute, 60_000 }, "jitter_ms"},
	} {
		bad := ok
		c.mod(&bad)
		var le *Error
		if err := bad.Validate(); !errors.As(err, &le) || le.Field != c.field {
			t.Errorf("Validate(%+v) = %v, want an error on %s", bad, err, c.field)
		}
	}
	if _, ok := ParseWeekday("sunday"); !ok {
		t.Fatal("sunday is a week start")
	}
	if _, ok := ParseWeekday("Sunday"); ok {
		t.Fatal("week starts are lower case")
	}
}

func TestCalendarOffset(t *testing.T) {
	c := CalendarWindow{Limit: 1, Period: PeriodDay, TimeZone: "UTC", JitterMS: 600_000}
	seen := map[time.Duration]bool{}
	for _, s := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		o := c.Offset(s)
		if o < 0 || o >= 600_000*time.Millisecond || o%time.Millisecond != 0 {
			t.Fatalf("Offset(%q) = %v, want whole ms in [0, 10m)", s, o)
		}
		if c.Offset(s) != o {
			t.Fatalf("Offset(%q) is not deterministic", s)
		}
		seen[o] = true
	}
	if len(seen) < 2 {
		t.Fatalf("eight subjects share one offset: %v", seen)
	}
	c.JitterMS = 0
	if c.Offset("a") != 0 {
		t.Fatal("no jitter, no offset")
	}
}

func TestParseCalendarSpec(t *testing.T) {
	for _, c := range []CalendarWindow{
		{Limit: 1000, Period: PeriodDay, TimeZone: "Asia/Shanghai", WeekStart: time.Monday},
		{Limit: 5, Period: PeriodWeek, TimeZone: "UTC", WeekStart: time.Sunday, JitterMS: 60_000},
	} {
		if got, ok := ParseCalendarSpec(c.Spec()); !ok || got != c {
			t.Errorf("ParseCalendarSpec(%q) = %+v, %v; want %+v", c.Spec(), got, ok, c)
		}
	}
	for _, s := range []string{"", "5:day:UTC:-", "5:day:UTC:sunday:0", "5:week:UTC:-:0", "0:day:UTC:-:0", "5:day:Nowhere:-:0", "05:day:UTC:-:0"} {
		if _, ok := ParseCalendarSpec(s); ok {
			t.Errorf("ParseCalendarSpec(%q) is ok", s)
		}
	}
}

// Periods counted from the epoch are envoyproxy/ratelimit's windows: a
// year of 365 days, a month of 30, weeks from a Thursday (1970-01-01).
func TestEpochWindowBounds(t *testing.T) {
	at := time.Date(2026, 12, 2, 2, 30, 15, 500_000_000, time.UTC)
	day := int64(86_400)
	for _, tc := range []struct {
		seconds    int64
		start, end time.Time
	}{
		{1, time.Date(2026, 12, 2, 2, 30, 15, 0, time.UTC), time.Date(2026, 12, 2, 2, 30, 16, 0, time.UTC)},
		{30, time.Date(2026, 12, 2, 2, 30, 0, 0, time.UTC), time.Date(2026, 12, 2, 2, 30, 30, 0, time.UTC)},
		{3600, time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC), time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)},
		{day, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)},
		// 2026-11-26 is a Thursday.
		{7 * day, time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)},
		{30 * day, time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)},
		{365 * day, time.Unix(56*365*day, 0).UTC(), time.Unix(57*365*day, 0).UTC()},
	} {
		w := EpochWindow(10, tc.seconds)
		if err := w.Validate(); err != nil {
			t.Fatalf("%d s: %v", tc.seconds, err)
		}
		start, end := w.Bounds(at)
		if !start.Equal(tc.start) || !end.Equal(tc.end) || start.After(at) || !end.After(at) {
			t.Errorf("%d s: Bounds = %v, %v; want %v, %v", tc.seconds, start, end, tc.start, tc.end)
		}
		// The edge itself starts the next period.
		if s, _ := w.Bounds(end); !s.Equal(end) {
			t.Errorf("%d s: the period holding its end starts at %v, want %v", tc.seconds, s, end)
		}
		back, ok := ParseCalendarSpec(w.Spec())
		if !ok || back != w {
			t.Errorf("ParseCalendarSpec(%q) = %+v, %v; want %+v", w.Spec(), back, ok, w)
		}
	}
	if got := EpochWindow(7, 90).Spec(); got != "7:epoch90:UTC:-:0" {
		t.Errorf("Spec = %q", got)
	}
}

// Only Go names a period counted from the epoch: the protocol and the
// policy file, which give no length, cannot.
func TestEpochWindowValidate(t *testing.T) {
	for _, w := range []CalendarWindow{
		{Limit: 1, Period: PeriodEpoch, TimeZone: "UTC"},
		{Limit: 1, Period: PeriodDay, TimeZone: "UTC", EpochSeconds: 60},
		EpochWindow(1, MaxEpochSeconds+1),
		EpochWindow(1, -1),
		{Limit: 1, Period: PeriodEpoch, TimeZone: "Europe/Berlin", EpochSeconds: 60},
		{Limit: 1, Period: PeriodEpoch, TimeZone: "UTC", EpochSeconds: 60, JitterMS: 5},
	} {
		if err := w.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", w)
		}
	}
	if err := EpochWindow(1, MaxEpochSeconds).Validate(); err != nil {
		t.Error(err)
	}
	for _, s := range []string{"1:epoch:UTC:-:0", "1:epoch0:UTC:-:0", "1:epoch60:UTC:monday:0", "1:epochx:UTC:-:0"} {
		if c, ok := ParseCalendarSpec(s); ok {
			t.Errorf("ParseCalendarSpec(%q) = %+v, want not ok", s, c)
		}
	}
}
