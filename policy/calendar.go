package policy

import (
	"errors"
	"time"

	"quotad/limits"
)

// calendarOwn are a calendar policy's fields.
var calendarOwn = []string{"limit", "period", "time_zone", "week_start", "jitter", "max_request_ids"}

// buildCalendar reads a calendar policy: limit and period (minute, hour,
// day, week, month) are required; time_zone defaults to UTC, week_start
// (of a week period only) to monday, jitter (a duration below one period)
// to none.
func buildCalendar(p *Policy, fp filePolicy, fail func(field, msg string) error) (*Policy, error) {
	if fp.Limit.IsZero() {
		return nil, fail("limit", "is required (units per period)")
	}
	limit, ok := intField(fp.Limit)
	if !ok || limit < 1 || limit > limits.MaxLimit {
		return nil, fail("limit", limitRange+quote(fp.Limit.Value))
	}
	if fp.Period == "" {
		return nil, fail("period", "is required: minute, hour, day, week or month")
	}
	c := limits.CalendarWindow{Limit: limit, Period: fp.Period, TimeZone: limits.DefaultTimeZone, WeekStart: limits.DefaultWeekStart}
	if fp.TimeZone != "" {
		c.TimeZone = fp.TimeZone
	}
	if fp.WeekStart != "" {
		if fp.Period != limits.PeriodWeek {
			return nil, fail("week_start", "is a field of a week period only, not of "+quote(fp.Period))
		}
		if c.WeekStart, ok = limits.ParseWeekday(fp.WeekStart); !ok {
			return nil, fail("week_start", "must be a day of the week in lower case (monday, ..., sunday), got "+quote(fp.WeekStart))
		}
	}
	if fp.Jitter != "" {
		d, err := time.ParseDuration(fp.Jitter)
		if err != nil || d%time.Millisecond != 0 || d < 0 {
			return nil, fail("jitter", "must be a duration of whole milliseconds such as 5m, got "+quote(fp.Jitter))
		}
		c.JitterMS = d.Milliseconds()
	}
	if err := c.Validate(); err != nil {
		var le *limits.Error
		if !errors.As(err, &le) {
			return nil, fail("", err.Error())
		}
		switch le.Field {
		case "period":
			return nil, fail("period", "must be one of minute, hour, day, week, month, got "+quote(fp.Period))
		case "time_zone":
			return nil, fail("time_zone", "must be an IANA zone name such as UTC or Europe/Berlin, got "+quote(fp.TimeZone))
		case "jitter_ms":
			return nil, fail("jitter", "must be less than one "+fp.Period+", got "+quote(fp.Jitter))
		}
		return nil, fail(le.Field, le.Message)
	}
	if err := readMaxRequestIDs(p, fp, fail); err != nil {
		return nil, err
	}
	p.Limit, p.Period, p.TimeZone, p.WeekStart, p.JitterMS = c.Limit, c.Period, c.TimeZone, c.WeekStart, c.JitterMS
	return p, nil
}

func (p *Policy) calendar() limits.CalendarWindow {
	return limits.CalendarWindow{Limit: p.Limit, Period: p.Period, TimeZone: p.TimeZone, WeekStart: p.WeekStart, JitterMS: p.JitterMS}
}
