package dispatch

import (
	"time"

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

// settling is the algorithm of a settle: Name and Key are its limit's
// algorithm's; its call is that algorithm's settle script, which
// luascript has for every algorithm but the concurrency lease.
type settling struct{ Algorithm }

// forOp is the algorithm that does op under alg's limits.
func forOp(op protocol.Op, alg Algorithm) Algorithm {
	if op == protocol.OpSettle {
		return settling{alg}
	}
	return alg
}

func (s settling) Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	if !luascript.Settles(s.Name()) {
		return luascript.Call{}, invalid("settle is for the fixed window, sliding window, calendar and token bucket; " +
			"this limit is " + s.Name() + ": free a lease with release")
	}
	return luascript.SettleCall(s.Name(), settleArgs(req, l, key))
}

// DeniedFor: a settle denies nothing.
func (settling) DeniedFor(*Outcome, int64) (time.Duration, int64) { return 0, 0 }

// settleArgs are the arguments of a settle of req under l: its limits'
// (those of a take of its algorithm, as its Call has them), its actual
// cost and the take's request id.
func settleArgs(req *protocol.Request, l *Limit, key string) luascript.Args {
	a := luascript.Args{Key: key, Cost: req.Cost, RequestID: req.RequestID, Strict: l.strict()}
	switch s := l.Shape.(type) {
	case limits.Window:
		a.Limit, a.WindowMS = s.Limit, s.WindowMS
	case limits.Sliding:
		a.Limit, a.WindowMS = s.Limit, s.WindowMS
	case limits.CalendarWindow:
		a.Limit, a.Spec, a.Periods = s.Limit, s.Spec(), luascript.CalendarAround(s, s.Offset(req.Subject), calendarClock())
	case limits.Bucket:
		a.TokenBucket, a.DedupeMS = bucketOf(l), l.DedupeMS
	}
	return a
}
