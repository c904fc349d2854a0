package rls

import (
	"testing"
	"time"

	"quotad/rls/descriptors"
)

// windowStart finds the window a take counted in from its reset_ms and
// the sidecar's clock, and refuses when it is not sure: the take took, or
// the clocks disagree by, more than an eighth of a window.
func TestWindowStart(t *testing.T) {
	minute := &descriptors.RateLimit{Unit: descriptors.UnitMinute, RequestsPerUnit: 1}
	thirty := &descriptors.RateLimit{Unit: descriptors.UnitSecond, UnitMultiplier: 30, RequestsPerUnit: 1}
	sent := time.UnixMilli(1_800_000_000_000 + 20_000) // 20 s into a minute
	for _, c := range []struct {
		l       *descriptors.RateLimit
		took    time.Duration
		resetMS int64
		start   int64
		ok      bool
	}{
		{minute, time.Millisecond, 40_000, 1_800_000_000_000, true},
		{minute, time.Millisecond, 40_000 - 500, 1_800_000_000_000, true},   // ran 500 ms after sent
		{minute, time.Millisecond, 40_000 + 7_000, 1_800_000_000_000, true}, // redis's clock 7 s behind
		{minute, time.Millisecond, 40_000 - 7_000, 1_800_000_000_000, true}, // 7 s ahead
		{minute, time.Millisecond, 40_000 + 8_000, 0, false},                // more than an eighth
		{minute, time.Millisecond, 40_000 - 8_000, 0, false},
		{minute, 8 * time.Second, 40_000, 0, false},                  // the take took more than an eighth
		{minute, time.Millisecond, 100_000, 1_800_000_060_000, true}, // the next window
		{thirty, time.Millisecond, 10_000, 1_800_000_000_000, true},  // 30 s windows
		{thirty, time.Millisecond, 40_000, 1_800_000_030_000, true},
	} {
		start, ok := windowStart(c.l, sent, c.took, c.resetMS)
		if ok != c.ok || ok && start != c.start {
			t.Errorf("windowStart(%v x%d, took %v, reset %d) = %d, %v; want %d, %v", c.l.Unit, c.l.UnitMultiplier, c.took, c.resetMS, start, ok, c.start, c.ok)
		}
	}
}
