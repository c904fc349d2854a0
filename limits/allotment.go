package limits

import (
	"strconv"
	"time"
)

// Allotment is a policy's allotment: how much of a key's quota one sidecar
// may reserve in Redis and hand out from memory (docs/allotments.md).
// SharePPM is the largest share, in parts per million, of what Redis says
// is left that one reservation may take; IdleMS how long reserved units
// stay unused, without a take on their key, before they go back.
type Allotment struct {
	SharePPM int64
	IdleMS   int64
}

// Bounds and defaults of an allotment. Units are in the names.
const (
	// ShareScale is a share of 1 in parts per million: max_share is
	// written as a fraction and sent to the scripts as an integer.
	ShareScale = 1_000_000
	// DefaultAllotmentSharePPM is max_share when not given: 0.05, so that
	// twenty sidecars reserving at once hold at most what is left, and one
	// reservation near the limit shrinks to a single take.
	DefaultAllotmentSharePPM = 50_000
	// MinAllotmentIdleMS and MaxAllotmentIdleMS bound idle: long enough
	// to outlast a timer's tick, short enough that unused units come
	// back within a minute.
	MinAllotmentIdleMS = 10
	MaxAllotmentIdleMS = 60 * 1000
	// DefaultAllotmentIdleMS is idle when not given.
	DefaultAllotmentIdleMS = 250
)

// AllotmentAlgorithms are the algorithms a policy may give an allotment:
// a concurrency lease is held, not consumed, and has nothing to reserve.
var AllotmentAlgorithms = []string{FixedWindow, Calendar, SlidingWindow, TokenBucket}

// AllotmentIdleText is how messages give idle's range.
var AllotmentIdleText = "from " + (MinAllotmentIdleMS * time.Millisecond).String() + " to " +
	(MaxAllotmentIdleMS * time.Millisecond).String()

// Validate reports the first bound the allotment breaks, as an *Error.
func (a Allotment) Validate() error {
	if a.SharePPM < 1 || a.SharePPM > ShareScale {
		return &Error{Field: "max_share", Message: "max_share must be above 0 and at most 1 (in steps of 1/" +
			strconv.Itoa(ShareScale) + ")"}
	}
	if a.IdleMS < MinAllotmentIdleMS || a.IdleMS > MaxAllotmentIdleMS {
		return &Error{Field: "idle", Message: "idle must be whole milliseconds " + AllotmentIdleText}
	}
	return nil
}
