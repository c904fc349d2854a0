package dispatch

import (
	"strconv"
	"time"

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
	a := luascript.Args{Key: key, Limit: w.Limit, WindowMS: w.WindowMS, Strict: l.strict()}
	switch req.Op {
	case protocol.OpPeek:
		return luascript.PeekCall(limits.FixedWindow, a)
	case protocol.OpTake:
		if req.Cost > w.Limit {
			return luascript.Call{}, invalid("cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the limit " + strconv.FormatInt(w.Limit, 10))
		}
		a.Cost, a.RequestID, a.MaxRequestIDs = req.Cost, req.RequestID, l.MaxRequestIDs
		return luascript.TakeCall(limits.FixedWindow, a)
	}
	return luascript.Call{}, errNotALease(l)
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
