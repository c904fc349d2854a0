package dispatch

import (
	"strconv"
	"time"

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
	a := luascript.Args{Key: key, Limit: w.Limit, WindowMS: w.WindowMS, Strict: l.strict()}
	switch req.Op {
	case protocol.OpPeek:
		return luascript.PeekCall(limits.SlidingWindow, a)
	case protocol.OpTake:
		if req.Cost > w.Limit {
			return luascript.Call{}, invalid("cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the limit " + strconv.FormatInt(w.Limit, 10))
		}
		a.Cost, a.RequestID, a.MaxRequestIDs = req.Cost, req.RequestID, l.MaxRequestIDs
		return luascript.TakeCall(limits.SlidingWindow, a)
	}
	return luascript.Call{}, errNotALease(l)
}

// DeniedFor: never. A denial does prove that takes of this cost or more
// fail until retry_after_ms (the estimate only falls with time, other
// takes only add), but the estimate falls all the while, by how much the
// outcome does not say (that needs the previous period's count), so an
// answer from memory could not report used and remaining as Redis would.
func (slidingWindow) DeniedFor(*Outcome, int64) (time.Duration, int64) { return 0, 0 }
