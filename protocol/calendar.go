package protocol

import (
	"quotad/limits"
)

// calendarFields are the inline fields of a calendar window beyond limit.
const calendarFields = fieldPeriod | fieldTimeZone | fieldWeekStart | fieldJitterMS

// validateCalendar checks a calendar window's inline fields: limit and
// period are required, time_zone defaults to UTC, week_start (for a week
// period only) to monday, jitter_ms to 0.
func (r *Request) validateCalendar() error {
	if r.fields&fieldLimit == 0 || r.fields&fieldPeriod == 0 {
		return invalid("calendar needs limit and period (minute, hour, day, week or month)")
	}
	if r.fields&fieldWeekStart != 0 {
		if r.Period != limits.PeriodWeek {
			return invalid("week_start is a field of a week period only")
		}
		if _, ok := limits.ParseWeekday(r.WeekStart); !ok {
			return invalid(limits.WeekStartRule)
		}
	}
	if r.fields&fieldTimeZone == 0 {
		r.TimeZone = limits.DefaultTimeZone
	} else if _, err := limits.LoadZone(r.TimeZone); err != nil {
		return invalidShape(err)
	}
	return invalidShape(r.calendarShape().Validate())
}

// calendarShape is the calendar window of the request's inline fields,
// with the defaults filled in.
func (r *Request) calendarShape() limits.CalendarWindow {
	ws := limits.DefaultWeekStart
	if d, ok := limits.ParseWeekday(r.WeekStart); ok {
		ws = d
	}
	tz := r.TimeZone
	if tz == "" {
		tz = limits.DefaultTimeZone
	}
	return limits.CalendarWindow{Limit: r.Limit, Period: r.Period, TimeZone: tz, WeekStart: ws, JitterMS: r.JitterMS}
}
