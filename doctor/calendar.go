package doctor

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"quotad/limits"
)

// calendarMarginMS is how long after its period's end a calendar window
// lives, as the calendar scripts set it.
const calendarMarginMS = 1000

// calendarTTL is the TTL a calendar window without one should have: until
// its period's end, plus the margin the scripts give it, computed from the
// key (the period's start and the subject) and the limits the window
// records. ok is false when the key or the hash is not a calendar
// window's, or its period has ended (then DefaultTTL is as good).
func calendarTTL(ctx context.Context, n rueidis.Client, key, prefix string, now time.Time) (int64, bool) {
	rest, found := strings.CutPrefix(key, prefix+"cal:{")
	cut := strings.LastIndex(rest, "}:")
	if !found || cut < 0 {
		return 0, false
	}
	startMS, err := strconv.ParseInt(rest[cut+2:], 10, 64)
	if err != nil {
		return 0, false
	}
	var subject string
	switch tag := rest[:cut]; {
	case strings.HasPrefix(tag, "i:"):
		subject = tag[len("i:"):]
	case strings.HasPrefix(tag, "e:"):
		// A counter of Envoy's rate limit service: its periods count from
		// the epoch, without jitter.
		subject = tag[len("e:"):]
	case strings.HasPrefix(tag, "p:"):
		_, s, ok := strings.Cut(tag[len("p:"):], ":")
		if !ok {
			return 0, false
		}
		subject = s
	default:
		return 0, false
	}
	spec, err := n.Do(ctx, n.B().Hget().Key(key).Field("policy").Build()).ToString()
	if err != nil {
		return 0, false
	}
	c, ok := limits.ParseCalendarSpec(spec)
	if !ok {
		return 0, false
	}
	start := time.UnixMilli(startMS)
	if s, _ := c.Bounds(start); !s.Equal(start) {
		return 0, false
	}
	_, end := c.Bounds(start)
	ttl := end.Add(c.Offset(subject)).UnixMilli() + calendarMarginMS - now.UnixMilli()
	return ttl, ttl > 0
}
