package dispatch

import (
	"strconv"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// parseReply reads the reply of a take, peek, release or settle under l
// into o (o.Op, Algorithm, Policy and Limit are set): every algorithm's
// scripts reply in one layout per op (luascript.ParseTake, ...), with the
// state's use and what is left of its limit. An error is the call's
// failure (failure.go).
func parseReply(op protocol.Op, l *Limit, res rueidis.RedisResult, o *Outcome) error {
	switch op {
	case protocol.OpSettle:
		return settleParse(res, o)
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
	if leases, ok := l.Shape.(limits.Leases); ok && o.Allowed {
		o.LeaseMS = leases.LeaseMS // how long the lease taken lives
	}
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

// settleParse reads a settle's reply into o: the settle scripts reply in
// one layout (luascript.ParseSettle).
func settleParse(res rueidis.RedisResult, o *Outcome) error {
	r, err := luascript.ParseSettle(res)
	o.Healed = r.Healed
	if err == nil {
		err = fits(r, o)
	}
	if err != nil {
		return err
	}
	o.Settled, o.Replay, o.Reserved = r.Settled, r.Replay, r.Reserved
	o.Used, o.Remaining, o.ResetMS, o.RetryAfterMS = r.Used, r.Remaining, r.ResetMS, r.RetryAfterMS
	return nil
}
