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

func (fixedWindow) Parse(req *protocol.Request, _ *Limit, res rueidis.RedisResult, o *Outcome) error {
	return parseReply(req.Op, res, o)
}

// parseReply reads the reply of a take, peek or release into o: every
// algorithm's scripts reply in one layout per op (luascript.ParseTake,
// ...), with the state's use and what is left of its limit.
func parseReply(op protocol.Op, res rueidis.RedisResult, o *Outcome) error {
	switch op {
	case protocol.OpPeek:
		r, err := luascript.ParsePeek(res)
		if err == nil {
			err = fits(r, o)
		}
		if err != nil {
			return err
		}
		// A fixed window without a TTL (-1) resets with the next take.
		o.Used, o.Remaining, o.ResetMS = r.Used, r.Remaining, max(r.ResetMS, 0)
		return nil
	case protocol.OpRelease:
		r, err := luascript.ParseRelease(res)
		if err != nil {
			return err
		}
		o.Released, o.Used, o.Remaining = r.Released, r.Used, max(o.Limit-r.Used, 0)
		return nil
	}
	r, err := luascript.ParseTake(res)
	o.Healed = r.Healed
	if err == nil {
		err = fits(r, o)
	}
	if err != nil {
		return err
	}
	o.Allowed, o.Replay, o.Used, o.Remaining = r.Allowed, r.Replay, r.Used, r.Remaining
	o.ResetMS, o.RetryAfterMS = r.ResetMS, r.RetryAfterMS
	return nil
}

// fits refuses a reply whose remaining passes the limit it was decided
// under: a reply no script of these limits sends.
func fits(r luascript.Result, o *Outcome) error {
	if r.Remaining > o.Limit {
		return malformedReply(o.Op.String() + ": remaining " + strconv.FormatInt(r.Remaining, 10) + " above the limit")
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
