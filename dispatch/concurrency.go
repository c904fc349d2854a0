package dispatch

import (
	"time"

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
	a := luascript.Args{Key: key, Limit: s.Limit, LeaseMS: s.LeaseMS, Strict: l.strict()}
	switch req.Op {
	case protocol.OpPeek:
		return luascript.PeekCall(limits.Concurrency, a)
	case protocol.OpRelease:
		// A release frees the lease whatever limits it names.
		return luascript.ReleaseCall(key, req.RequestID)
	}
	switch {
	case req.RequestID == "":
		return luascript.Call{}, invalid("a concurrency take needs a request_id: it names the lease")
	case req.Cost != 1:
		return luascript.Call{}, invalid("a concurrency take holds one lease: cost must be 1")
	}
	a.RequestID = req.RequestID
	return luascript.TakeCall(limits.Concurrency, a)
}

// DeniedFor: never. A lease may be released at any moment, so a denial
// says nothing about the next take.
func (concurrency) DeniedFor(*Outcome, int64) (time.Duration, int64) { return 0, 0 }
