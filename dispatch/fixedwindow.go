package dispatch

import (
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// fixedWindow is a window that opens at its first accepted take and lasts
// window_ms; nothing extends it. A window frees capacity only when it ends.
type fixedWindow struct{}

func (fixedWindow) Name() string { return limits.FixedWindow }

func (fixedWindow) Key(prefix, policy, subject string) string {
	return luascript.FixedWindowKey(prefix, policy, subject)
}

func (fixedWindow) Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	w := l.Shape.(limits.Window)
	switch req.Op {
	case protocol.OpPeek:
		return luascript.PeekCall(luascript.PeekArgs{Key: key, Limit: w.Limit, WindowMS: w.WindowMS, Strict: l.strict()})
	case protocol.OpTake:
		if req.Cost > w.Limit {
			return luascript.Call{}, invalid("cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the limit " + strconv.FormatInt(w.Limit, 10))
		}
		return luascript.TakeCall(luascript.TakeArgs{
			Key: key, Limit: w.Limit, WindowMS: w.WindowMS, Cost: req.Cost,
			RequestID: req.RequestID, Strict: l.strict(), MaxRequestIDs: l.MaxRequestIDs,
		})
	}
	return luascript.Call{}, errNotALease(l)
}

func (fixedWindow) Parse(req *protocol.Request, l *Limit, res rueidis.RedisResult, o *Outcome) error {
	if req.Op == protocol.OpPeek {
		r, err := luascript.ParsePeek(res)
		if err != nil {
			return err
		}
		o.Used, o.Remaining, o.ResetMS = r.Used, max(o.Limit-r.Used, 0), max(r.ResetMS, 0)
		return nil
	}
	r, err := luascript.ParseTake(res)
	o.Healed = r.Healed
	if err != nil {
		return err
	}
	o.Allowed, o.Replay, o.Used, o.Remaining, o.ResetMS = r.Allowed, r.Replay, r.Used, max(o.Limit-r.Used, 0), r.ResetMS
	if !r.Allowed {
		// A fixed window frees capacity only when it ends.
		o.RetryAfterMS = r.ResetMS
	}
	return nil
}

// DeniedFor: within one window a key's use never decreases, so if use u
// plus cost c exceeded the limit when Redis answered, u' + c exceeds it for
// any later use u' >= u, until the window ends.
func (fixedWindow) DeniedFor(o *Outcome, _ int64) (time.Duration, int64) {
	return time.Duration(o.ResetMS) * time.Millisecond, o.Limit - o.Used + 1
}

// errNotALease refuses a release of a limit that holds no leases.
func errNotALease(l *Limit) error {
	return invalid("release frees a concurrency lease; this limit is " + l.Algorithm.Name())
}
