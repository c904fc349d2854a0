package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"quotad/limits"
)

func TestParseConfigCalendar(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
policies:
  daily:
    algorithm: calendar
    limit: 1000
    period: day
    time_zone: Asia/Shanghai
  weekly:
    algorithm: calendar
    limit: 50
    period: week
    week_start: sunday
    jitter: 10m
    max_request_ids: 20
  monthly:
    algorithm: calendar
    limit: 3
    period: month
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]limits.CalendarWindow{
		"daily":   {Limit: 1000, Period: "day", TimeZone: "Asia/Shanghai", WeekStart: time.Monday},
		"weekly":  {Limit: 50, Period: "week", TimeZone: "UTC", WeekStart: time.Sunday, JitterMS: 600_000},
		"monthly": {Limit: 3, Period: "month", TimeZone: "UTC", WeekStart: time.Monday},
	} {
		p := cfg.Policies[name]
		if got := p.Shape(); got != want {
			t.Errorf("%s: shape %+v, want %+v", name, got, want)
		}
	}
	if n := cfg.Policies["weekly"].MaxRequestIDs; n != 20 {
		t.Errorf("weekly: max_request_ids %d", n)
	}
	if n := cfg.Policies["daily"].MaxRequestIDs; n != limits.DefaultMaxRequestIDs {
		t.Errorf("daily: max_request_ids %d, want the default", n)
	}
}

func TestParseConfigCalendarErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ yaml, field, says string }{
		{"algorithm: calendar\n    period: day", "limit", "required"},
		{"algorithm: calendar\n    limit: 0\n    period: day", "limit", "1 to"},
		{"algorithm: calendar\n    limit: 5", "period", "required"},
		{"algorithm: calendar\n    limit: 5\n    period: 1d", "period", "minute, hour"},
		{"algorithm: calendar\n    limit: 5\n    period: day\n    time_zone: Europe/Atlantis", "time_zone", "Europe/Atlantis"},
		{"algorithm: calendar\n    limit: 5\n    period: day\n    time_zone: Local", "time_zone", "IANA"},
		{"algorithm: calendar\n    limit: 5\n    period: week\n    week_start: Sunday", "week_start", "lower case"},
		{"algorithm: calendar\n    limit: 5\n    period: day\n    week_start: sunday", "week_start", "week period only"},
		{"algorithm: calendar\n    limit: 5\n    period: hour\n    jitter: 1h", "jitter", "less than one hour"},
		{"algorithm: calendar\n    limit: 5\n    period: hour\n    jitter: soon", "jitter", "duration"},
		{"algorithm: calendar\n    limit: 5\n    period: day\n    window: 1s", "window", "not a field of calendar"},
		{"algorithm: calendar\n    limit: 5\n    period: day\n    lease: 1s", "lease", "not a field of calendar"},
		{"limit: 5\n    window: 1s\n    time_zone: UTC", "time_zone", "not a field of fixed_window"},
		{"algorithm: token_bucket\n    rate: 1\n    period: 1s\n    jitter: 1s", "jitter", "not a field of token_bucket"},
	} {
		_, err := ParseConfig([]byte("policies:\n  p:\n    " + tc.yaml + "\n"))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Policy != "p" || ce.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: err = %v, want a ConfigError for policy p, field %s, saying %q", tc.yaml, err, tc.field, tc.says)
		}
	}
}
