package dispatch

import (
	"strconv"
	"time"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// calendar is a fixed window aligned to the calendar of a time zone: a
// minute, hour, day, week or month. The sidecar computes the periods
// around its own clock; the script counts in the one holding Redis's
// clock (luascript/calendar_take.lua), so every sidecar agrees.
type calendar struct{}

func (calendar) Name() string { return limits.Calendar }

// Key is what a subject's periods share: the same-key order and the local
// denial are per subject, and each period's window is a key of its own
// (luascript.CalendarPeriodKey).
func (calendar) Key(prefix, policy, subject string) string {
	return luascript.CalendarKey(prefix, policy, subject)
}

// calendarClock is the sidecar's clock, read for each call.
var calendarClock = time.Now

func (calendar) Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	c := l.Shape.(limits.CalendarWindow)
	a := luascript.Args{
		Key: key, Spec: c.Spec(), Limit: c.Limit, Periods: luascript.CalendarAround(c, c.Offset(req.Subject), calendarClock()),
		Strict: l.strict(),
	}
	switch req.Op {
	case protocol.OpPeek:
		return luascript.PeekCall(limits.Calendar, a)
	case protocol.OpTake:
		if req.Cost > c.Limit {
			return luascript.Call{}, invalid("cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the limit " + strconv.FormatInt(c.Limit, 10))
		}
		a.Cost, a.RequestID, a.MaxRequestIDs = req.Cost, req.RequestID, l.MaxRequestIDs
		return luascript.TakeCall(limits.Calendar, a)
	}
	return luascript.Call{}, errNotALease(l)
}

// DeniedFor: as for the fixed window, use within a period never
// decreases, so the denial holds for any cost above what is left until
// the period ends, Redis's reset_ms counted from before the call. The
// next period is another key, which starts empty.
func (calendar) DeniedFor(o *Outcome, _ int64) (time.Duration, int64) {
	return time.Duration(o.ResetMS) * time.Millisecond, o.Limit - o.Used + 1
}

// givingBack is the calendar window's give back (Given.GiveBack): its
// use falls by the cost, never below zero, and the reply is a peek's of
// the window after (luascript/calendar_give.lua).
type givingBack struct{ calendar }

func (givingBack) Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	c := l.Shape.(limits.CalendarWindow)
	return luascript.CalendarGiveCall(luascript.Args{
		Key: key, Spec: c.Spec(), Limit: c.Limit, Periods: luascript.CalendarAround(c, c.Offset(req.Subject), calendarClock()),
		Cost: req.Cost, Strict: l.strict(),
	})
}

// DeniedFor: a give back denies nothing.
func (givingBack) DeniedFor(*Outcome, int64) (time.Duration, int64) { return 0, 0 }
