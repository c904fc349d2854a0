package protocol_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"quotad/limits"
	"quotad/protocol"
)

func TestDecodeCalendar(t *testing.T) {
	for _, tt := range []struct {
		line string
		want limits.CalendarWindow
	}{
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":1000,"period":"day","time_zone":"Asia/Shanghai"}`,
			limits.CalendarWindow{Limit: 1000, Period: "day", TimeZone: "Asia/Shanghai", WeekStart: time.Monday}},
		{`{"op":"peek","subject":"s","algorithm":"calendar","limit":5,"period":"month"}`,
			limits.CalendarWindow{Limit: 5, Period: "month", TimeZone: "UTC", WeekStart: time.Monday}},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"week","week_start":"sunday","jitter_ms":60000}`,
			limits.CalendarWindow{Limit: 5, Period: "week", TimeZone: "UTC", WeekStart: time.Sunday, JitterMS: 60000}},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"minute","time_zone":null}`,
			limits.CalendarWindow{Limit: 5, Period: "minute", TimeZone: "UTC", WeekStart: time.Monday}},
	} {
		var r protocol.Request
		if err := protocol.Decode([]byte(tt.line), &r); err != nil {
			t.Fatalf("Decode(%s): %v", tt.line, err)
		}
		if got := r.InlineShape(); got != tt.want {
			t.Fatalf("Decode(%s) = %+v, want %+v", tt.line, got, tt.want)
		}
	}
}

func TestDecodeCalendarInvalid(t *testing.T) {
	for _, tt := range []struct{ line, field string }{
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5}`, "period"},
		{`{"op":"take","subject":"s","algorithm":"calendar","period":"day"}`, "limit"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"fortnight"}`, "period"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"Day"}`, "period"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"day","time_zone":"Mars/Olympus"}`, "time_zone"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"day","time_zone":""}`, "time_zone"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"day","time_zone":"Local"}`, "time_zone"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"day","time_zone":8}`, "time_zone"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"week","week_start":"funday"}`, "week_start"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"day","week_start":"monday"}`, "week_start"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"minute","jitter_ms":60000}`, "jitter_ms"},
		{`{"op":"take","subject":"s","algorithm":"calendar","limit":5,"period":"day","window_ms":1000}`, "window_ms"},
		{`{"op":"take","subject":"s","algorithm":"fixed_window","limit":5,"window_ms":1000,"period":"day"}`, "period"},
		{`{"op":"take","subject":"s","policy":"p","time_zone":"UTC"}`, "policy"},
	} {
		var r protocol.Request
		err := protocol.Decode([]byte(tt.line), &r)
		if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("Decode(%s) = %v, want INVALID naming %s", tt.line, err, tt.field)
		}
	}
}
