package dispatch

import (
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// slidingWindow is the two-window counter: the current and previous
// periods of window_ms, aligned to Redis's clock, the previous one weighted
// by how much of it the last window_ms still overlaps.
type slidingWindow struct{}

func (slidingWindow) Name() string { return limits.SlidingWindow }

func (slidingWindow) Key(prefix, policy, subject string) string {
	return luascript.SlidingWindowKey(prefix, policy, subject)
}

func (slidingWindow) Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	w := l.Shape.(limits.Sliding)
	switch req.Op {
	case protocol.OpPeek:
		return luascript.SlidingWindowPeekCall(luascript.SlidingWindowPeekArgs{Key: key, Limit: w.Limit, WindowMS: w.WindowMS, Strict: l.strict()})
	case protocol.OpTake:
		if req.Cost > w.Limit {
			return luascript.Call{}, invalid("cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the limit " + strconv.FormatInt(w.Limit, 10))
		}
		return luascript.SlidingWindowTakeCall(luascript.SlidingWindowArgs{
			Key: key, Limit: w.Limit, WindowMS: w.WindowMS, Cost: req.Cost,
			RequestID: req.RequestID, Strict: l.strict(), MaxRequestIDs: l.MaxRequestIDs,
		})
	}
	return luascript.Call{}, errNotALease(l)
}

func (slidingWindow) Parse(req *protocol.Request, l *Limit, res rueidis.RedisResult, o *Outcome) error {
	if req.Op == protocol.OpPeek {
		r, err := luascript.ParseSlidingWindowPeek(res)
		if err != nil {
			return err
		}
		o.Used, o.Remaining, o.ResetMS = r.Used, max(o.Limit-r.Used, 0), r.ResetMS
		return nil
	}
	r, err := luascript.ParseSlidingWindowTake(res)
	o.Healed = r.Healed
	if err != nil {
		return err
	}
	o.Allowed, o.Replay, o.Used, o.Remaining = r.Allowed, r.Replay, r.Used, max(o.Limit-r.Used, 0)
	o.ResetMS, o.RetryAfterMS = r.ResetMS, r.RetryAfterMS
	return nil
}

// DeniedFor: a denial holds until retry_after_ms less one ms, for this cost
// or more, and that is exact. Without other takes the estimate only falls
// with time, and the script's retry_after_ms is the first whole ms of
// Redis's clock at which a take of this cost fits (exact, see the
// prelude's sliding_window); other takes only add to the counts, a denial
// or a replay changes nothing, and a larger cost fits no earlier. Redis decided
// at some instant of its clock in [now, now + 1 ms), now its whole ms, and
// the call was sent before that, so a hold of retry_after_ms - 1 from the
// send ends before now + retry_after_ms, the first instant the take could
// be accepted. A reload (a named policy's new limit or window) starts the
// local denial afresh, and inline limits are strict, so the limits cannot
// change under an entry.
func (slidingWindow) DeniedFor(o *Outcome, cost int64) (time.Duration, int64) {
	if o.RetryAfterMS <= 1 {
		return 0, cost
	}
	return time.Duration(o.RetryAfterMS-1) * time.Millisecond, cost
}
