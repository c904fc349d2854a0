package dispatch

import (
	"time"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// concurrency is a set of leases, each named by its take's request_id, held
// until released or until lease_ms passes without a renewal.
type concurrency struct{}

func (concurrency) Name() string { return limits.Concurrency }

func (concurrency) Key(prefix, policy, subject string) string {
	return luascript.ConcurrencyKey(prefix, policy, subject)
}

func (concurrency) Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	s := l.Shape.(limits.Leases)
	shape := luascript.Leases{Limit: s.Limit, LeaseMS: s.LeaseMS}
	switch req.Op {
	case protocol.OpPeek:
		return luascript.ConcurrencyPeekCall(luascript.LeasePeekArgs{Key: key, Leases: shape, Strict: l.strict()})
	case protocol.OpRelease:
		// A release frees the lease whatever limits it names.
		return luascript.ConcurrencyReleaseCall(key, req.RequestID)
	}
	switch {
	case req.RequestID == "":
		return luascript.Call{}, invalid("a concurrency take needs a request_id: it names the lease")
	case req.Cost != 1:
		return luascript.Call{}, invalid("a concurrency take holds one lease: cost must be 1")
	}
	return luascript.ConcurrencyTakeCall(luascript.LeaseArgs{Key: key, Leases: shape, RequestID: req.RequestID, Strict: l.strict()})
}

func (concurrency) Parse(req *protocol.Request, l *Limit, res rueidis.RedisResult, o *Outcome) error {
	switch req.Op {
	case protocol.OpPeek:
		r, err := luascript.ParseConcurrencyPeek(res)
		if err != nil {
			return err
		}
		o.Used, o.Remaining, o.ResetMS = r.Used, max(o.Limit-r.Used, 0), r.ResetMS
		return nil
	case protocol.OpRelease:
		r, err := luascript.ParseConcurrencyRelease(res)
		if err != nil {
			return err
		}
		o.Released, o.Used, o.Remaining = r.Released, r.Used, max(o.Limit-r.Used, 0)
		return nil
	}
	r, err := luascript.ParseConcurrencyTake(res)
	o.Healed = r.Healed
	if err != nil {
		return err
	}
	o.Allowed, o.Replay, o.Used, o.Remaining = r.Allowed, r.Replay, r.Used, max(o.Limit-r.Used, 0)
	o.ResetMS, o.RetryAfterMS = r.ResetMS, r.RetryAfterMS
	if r.Allowed {
		o.LeaseMS = l.Shape.(limits.Leases).LeaseMS
	}
	return nil
}

// DeniedFor: never. A lease may be released at any moment, so a denial
// says nothing about the next take.
func (concurrency) DeniedFor(*Outcome, int64) (time.Duration, int64) { return 0, 0 }
