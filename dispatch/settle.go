package dispatch

import (
	"time"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// A settle gives the actual cost of an accepted take, named by its
// addressing and request_id: the state moves by the difference from what
// the take reserved, either way, in one script (luascript/settle.go). It is
// never limited, never degraded (on_unavailable is for takes) and never
// answered by the local denial; it drops the local denial of its key, so
// that a take a settle made possible is never denied from memory.

// Results of a settle, for the metrics.
const (
	ResultSettled    = "settled"
	ResultNotSettled = "not_settled" // the state held no take of that request_id
)

// settler is an algorithm that settles takes.
type settler interface {
	settleCall(req *protocol.Request, l *Limit, key string) (luascript.Call, error)
	// settleParse reads the script's reply into o.
	settleParse(res rueidis.RedisResult, o *Outcome) error
}

// settling is the algorithm of a settle: Name and Key are its limit's
// algorithm's, and so are the call and the parser, from its settler.
type settling struct{ Algorithm }

// forOp is the algorithm that does op under alg's limits.
func forOp(op protocol.Op, alg Algorithm) Algorithm {
	if op == protocol.OpSettle {
		return settling{alg}
	}
	return alg
}

func (s settling) Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	st, ok := s.Algorithm.(settler)
	if !ok {
		return luascript.Call{}, invalid("settle is for the fixed window, sliding window, calendar and token bucket; " +
			"this limit is " + s.Name() + ": free a lease with release")
	}
	return st.settleCall(req, l, key)
}

func (s settling) Parse(_ *protocol.Request, _ *Limit, res rueidis.RedisResult, o *Outcome) error {
	return s.Algorithm.(settler).settleParse(res, o)
}

// DeniedFor: a settle denies nothing.
func (settling) DeniedFor(*Outcome, int64) (time.Duration, int64) { return 0, 0 }

// settled fills o from a settle's result: a window's used, or a bucket's
// remaining tokens.
func settled(r luascript.SettleResult, o *Outcome, bucket bool) {
	o.Settled, o.Replay, o.Reserved = r.Settled, r.Replay, r.Reserved
	if bucket {
		o.Used, o.Remaining = max(o.Limit-r.Remaining, 0), r.Remaining
	} else {
		o.Used, o.Remaining = r.Used, max(o.Limit-r.Used, 0)
	}
	o.ResetMS, o.RetryAfterMS = r.ResetMS, r.RetryAfterMS
}

func (fixedWindow) settleCall(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	w := l.Shape.(limits.Window)
	return luascript.FixedWindowSettleCall(luascript.WindowSettleArgs{
		Key: key, Limit: w.Limit, WindowMS: w.WindowMS, Cost: req.Cost, RequestID: req.RequestID, Strict: l.strict(),
	})
}

func (fixedWindow) settleParse(res rueidis.RedisResult, o *Outcome) error {
	r, err := luascript.ParseFixedWindowSettle(res)
	o.Healed = r.Healed
	if err == nil {
		settled(r, o, false)
	}
	return err
}

func (slidingWindow) settleCall(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	w := l.Shape.(limits.Sliding)
	return luascript.SlidingWindowSettleCall(luascript.WindowSettleArgs{
		Key: key, Limit: w.Limit, WindowMS: w.WindowMS, Cost: req.Cost, RequestID: req.RequestID, Strict: l.strict(),
	})
}

func (slidingWindow) settleParse(res rueidis.RedisResult, o *Outcome) error {
	r, err := luascript.ParseSlidingWindowSettle(res)
	o.Healed = r.Healed
	if err == nil {
		settled(r, o, false)
	}
	return err
}

func (calendar) settleCall(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	c := l.Shape.(limits.CalendarWindow)
	return luascript.CalendarSettleCall(luascript.CalendarSettleArgs{
		Key: key, Spec: c.Spec(), Limit: c.Limit, Periods: luascript.CalendarAround(c, c.Offset(req.Subject), calendarClock()),
		Cost: req.Cost, RequestID: req.RequestID, Strict: l.strict(),
	})
}

func (calendar) settleParse(res rueidis.RedisResult, o *Outcome) error {
	r, err := luascript.ParseCalendarSettle(res)
	o.Healed = r.Healed
	if err == nil {
		settled(r, o, false)
	}
	return err
}

func (tokenBucket) settleCall(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	return luascript.TokenBucketSettleCall(luascript.TokenBucketSettleArgs{
		Key: key, TokenBucket: bucketOf(l), Cost: req.Cost, RequestID: req.RequestID, DedupeMS: l.DedupeMS, Strict: l.strict(),
	})
}

func (tokenBucket) settleParse(res rueidis.RedisResult, o *Outcome) error {
	r, err := luascript.ParseTokenBucketSettle(res)
	o.Healed = r.Healed
	if err != nil {
		return err
	}
	if r.Remaining > o.Limit {
		return malformedReply("token bucket settle: remaining above the burst")
	}
	settled(r, o, true)
	return nil
}
