package rls

import (
	"testing"
	"time"

	"quotad/rls/descriptors"
)

// windowStart finds the window a take counted in from its reset_ms and
// the sidecar's clock, and refuses when they disagree by more than a
// quarter of a window.
func TestWindowStart(t *testing.T) {
	minute := &descriptors.RateLimit{Unit: descriptors.UnitMinute, RequestsPerUnit: 1}
	thirty := &descriptors.RateLimit{Unit: descriptors.UnitSecond, UnitMultiplier: 30, RequestsPerUnit: 1}
	at := time.UnixMilli(1_800_000_000_000 + 20_000) // 20 s into a minute
	for _, c := range []struct {
		l       *descriptors.RateLimit
		resetMS int64
		start   int64
		ok      bool
	}{
		{minute, 40_000, 1_800_000_000_000, true},
		{minute, 40_000 + 14_000, 1_800_000_000_000, true}, // redis's clock 14 s behind
		{minute, 40_000 - 14_000, 1_800_000_000_000, true}, // 14 s ahead
		{minute, 40_000 + 16_000, 0, false},                // more than a quarter
		{minute, 40_000 - 16_000, 0, false},                //
		{minute, 100_000, 1_800_000_060_000, true},         // the next window
		{thirty, 10_000, 1_800_000_000_000, true},          // 30 s windows
		{thirty, 40_000, 1_800_000_030_000, true},          //
	} {
		start, ok := windowStart(c.l, at, c.resetMS)
		if ok != c.ok || ok && start != c.start {
			t.Errorf("windowStart(%v x%d, reset %d) = %d, %v; want %d, %v", c.l.Unit, c.l.UnitMultiplier, c.resetMS, start, ok, c.start, c.ok)
		}
	}
}
