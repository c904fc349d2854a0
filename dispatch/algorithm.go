package dispatch

import (
	"time"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// Algorithm is one way of deciding quota. Each is one implementation of
// this interface, registered in algorithms; the dispatcher, the batcher,
// the local denial, the metrics and the decision log work for every
// algorithm through it.
type Algorithm interface {
	// Name is the algorithm's name on the wire and in the policy file.
	Name() string
	// Key is the Redis key of a subject's state. policy is "" for inline
	// limits.
	Key(prefix, policy, subject string) string
	// Call checks that the algorithm can do req (a take, peek or release)
	// under l and builds its script call. An error is the request's
	// INVALID answer; nothing is sent. Every script of an op replies in
	// one layout, which parseReply reads for every algorithm.
	Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error)
	// DeniedFor says for how long a take Redis denied (o, of cost) proves
	// that takes of at least need under the same limits are denied too,
	// counted from before the call; 0 when it proves nothing (a lease may
	// be released at any moment). The local denial answers such takes
	// from memory until then (localdeny.go).
	DeniedFor(o *Outcome, cost int64) (hold time.Duration, need int64)
}

// algorithms is the registry: an algorithm's Name to its implementation.
var algorithms = map[string]Algorithm{
	limits.FixedWindow:   fixedWindow{},
	limits.TokenBucket:   tokenBucket{},
	limits.Concurrency:   concurrency{},
	limits.SlidingWindow: slidingWindow{},
	limits.Calendar:      calendar{},
}

// Limit is what a request is decided against once its policy (or inline
// limits) is resolved.
type Limit struct {
	Algorithm Algorithm
	Shape     limits.Shape
	// Policy is the named policy, "" for inline limits, which are strict:
	// a live key written under other limits is POLICY.
	Policy        string
	Shadow        bool   // the policy's mode is shadow
	OnUnavailable string // policy.OnUnavailable*; "" for inline limits
	MaxRequestIDs int64
	// DedupeMS is how long a token bucket remembers a request id.
	DedupeMS int64
	// Allotment: takes may be answered from units reserved in Redis
	// (allotment.go); nil for none.
	Allotment *limits.Allotment
}

// strict reports whether a live key written under other limits is an
// error (inline limits) rather than adopting the new ones (a policy,
// whose operator's change applies at once).
func (l *Limit) strict() bool { return l.Policy == "" }

// invalid is a request's INVALID error.
func invalid(msg string) error {
	return &protocol.Error{Code: protocol.CodeInvalid, Message: msg}
}

// ms is d in whole milliseconds, rounded up.
func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }
