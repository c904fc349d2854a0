package dispatch

import (
	"quotad/limits"
	"quotad/protocol"
)

// Outcome is what one take, peek or release decided: a value, rendered
// into a reply line once (AppendReply). Metrics, the decision log, shadow
// mode and on_unavailable read it; nothing reads a reply line back.
type Outcome struct {
	Op        protocol.Op
	Algorithm string // "" when the request failed before its limits were known
	Policy    string // the named policy, "" for inline limits

	// Code is the error of a request that was not decided ("" when it
	// was), with its message.
	Code    protocol.Code
	Message string

	// The decision.
	Allowed      bool
	Replay       bool
	Released     bool  // a release freed a held lease
	Settled      bool  // a settle found its take (settle.go)
	Reserved     int64 // what a settled take had reserved
	Limit        int64
	Used         int64
	Remaining    int64
	ResetMS      int64
	RetryAfterMS int64
	LeaseMS      int64 // a granted lease's life

	// Degraded: Redis could not decide and the policy's on_unavailable
	// answered instead.
	Degraded bool
	// Shadow: the policy is in shadow mode, so Allowed is true and
	// ShadowAllowed is what an enforced policy would have answered.
	Shadow        bool
	ShadowAllowed bool
	// Local: the sidecar denied the take from what Redis answered before,
	// without asking it (localdeny.go).
	Local bool
	// Allotted: the take was allowed from units the sidecar reserved in
	// Redis (allotment.go); the reply says "local":true.
	Allotted bool
	// Healed: the script found the key without a TTL and restored one.
	Healed bool

	// Headers: the request asked for the RateLimit header fields, which
	// the reply renders from this outcome and Shape, the limit it was
	// decided under (headers.go); Shape is nil when the limits were not
	// resolved.
	Headers bool
	Shape   limits.Shape

	// Checks are the outcomes of a take with "checks", one per check in
	// the request's order (checks.go); nil for a request without, which is
	// its one check's outcome itself (check). Skipped: a check of such a
	// take that was not asked, since another check's answer decided the
	// take.
	Checks  []Outcome
	Skipped bool
}

// check is the outcome of check i of o's request: o itself for a request
// without "checks".
func (o *Outcome) check(i int) *Outcome {
	if o.Checks == nil {
		return o
	}
	return &o.Checks[i]
}

// fresh is o as Prepare left it: what it is about, nothing decided.
func (o *Outcome) fresh() Outcome {
	return Outcome{
		Op: o.Op, Algorithm: o.Algorithm, Policy: o.Policy, Limit: o.Limit,
		Headers: o.Headers, Shape: o.Shape, Checks: o.Checks,
	}
}

// accepted reports whether a take's check found room, before shadow mode
// turned its answer.
func (o *Outcome) accepted() bool {
	if o.Shadow {
		return o.ShadowAllowed
	}
	return o.Allowed
}

// Failed reports whether the request ended in an error reply.
func (o *Outcome) Failed() bool { return o.Code != "" }

// fail makes o an error outcome.
func (o *Outcome) fail(code protocol.Code, msg string) {
	o.Code, o.Message = code, msg
}

// Denied reports whether the caller is refused, or (shadow mode) would be
// under enforcement.
func (o *Outcome) Denied() bool {
	if o.Failed() || o.Op != protocol.OpTake {
		return false
	}
	if o.Shadow {
		return !o.ShadowAllowed
	}
	return !o.Allowed
}

// AppendReply renders o as the reply line to a request with the raw JSON
// id (nil for none), with its '\n'.
func (o *Outcome) AppendReply(dst, id []byte) []byte {
	if o.Failed() {
		return protocol.AppendError(dst, id, o.Code, o.Message)
	}
	switch o.Op {
	case protocol.OpPeek:
		return protocol.AppendPeek(dst, id, protocol.PeekReply{
			Limit: o.Limit, Used: o.Used, Remaining: o.Remaining, ResetMS: o.ResetMS,
			Headers: o.headerFields(),
		})
	case protocol.OpRelease:
		return protocol.AppendRelease(dst, id, protocol.ReleaseReply{
			Released: o.Released, Limit: o.Limit, Used: o.Used, Remaining: o.Remaining,
		})
	case protocol.OpSettle:
		return protocol.AppendSettle(dst, id, protocol.SettleReply{
			Settled: o.Settled, Replay: o.Replay, Reserved: o.Reserved, Limit: o.Limit, Used: o.Used,
			Remaining: o.Remaining, ResetMS: o.ResetMS, RetryAfterMS: o.RetryAfterMS, Headers: o.headerFields(),
		})
	}
	if o.Checks == nil {
		return protocol.AppendTake(dst, id, protocol.TakeReply{
			Allowed: o.Allowed, Replay: o.Replay, Limit: o.Limit, Used: o.Used, Remaining: o.Remaining,
			ResetMS: o.ResetMS, RetryAfterMS: o.RetryAfterMS, LeaseMS: o.LeaseMS,
			Degraded: o.Degraded, Shadow: o.Shadow, ShadowAllowed: o.ShadowAllowed, Local: o.Allotted,
			Headers: o.headerFields(),
		})
	}
	// A take with "checks" answers each check as a take of that limit.
	r := protocol.ChecksReply{
		Allowed: o.Allowed, Replay: o.Replay, RetryAfterMS: o.RetryAfterMS, Degraded: o.Degraded,
		Checks: make([]protocol.CheckReply, len(o.Checks)), Headers: o.headerFields(),
	}
	for i := range o.Checks {
		c := &o.Checks[i]
		r.Checks[i] = protocol.CheckReply{
			Allowed: c.Allowed, Replay: c.Replay, Limit: c.Limit, Used: c.Used, Remaining: c.Remaining,
			ResetMS: c.ResetMS, RetryAfterMS: c.RetryAfterMS, LeaseMS: c.LeaseMS,
			Shadow: c.Shadow, ShadowAllowed: c.ShadowAllowed, Degraded: c.Degraded, Skipped: c.Skipped,
		}
	}
	return protocol.AppendChecks(dst, id, r)
}

// Results of a request, as the metrics and the decision log name them. An
// error reply is counted under its wire code (UNAVAILABLE, ...).
const (
	ResultAllowed       = "allowed"
	ResultDenied        = "denied"
	ResultReplay        = "replay"
	ResultDegraded      = "degraded"
	ResultShadowAllowed = "shadow_allowed"
	ResultShadowDenied  = "shadow_denied"
	ResultReleased      = "released"
	ResultNotHeld       = "not_held" // a release of a lease that was not held
	ResultOK            = "ok"       // a peek, a ping
)

// Result names o for the metrics.
func (o *Outcome) Result() string {
	switch {
	case o.Failed():
		return string(o.Code)
	case o.Op == protocol.OpPeek:
		return ResultOK
	case o.Op == protocol.OpRelease && o.Released:
		return ResultReleased
	case o.Op == protocol.OpRelease:
		return ResultNotHeld
	case o.Op == protocol.OpSettle && !o.Settled:
		return ResultNotSettled
	case o.Op == protocol.OpSettle && !o.Replay:
		return ResultSettled
	case o.Replay:
		return ResultReplay
	case o.Degraded:
		return ResultDegraded
	case o.Shadow && o.ShadowAllowed:
		return ResultShadowAllowed
	case o.Shadow:
		return ResultShadowDenied
	case o.Allowed:
		return ResultAllowed
	}
	return ResultDenied
}

// applyShadow turns a take's real verdict into a shadow policy's answer:
// the caller is always allowed, and ShadowAllowed carries what an enforced
// policy would have answered. The Redis state is the enforced one: an
// accepted take consumed and recorded its request id as it would under
// enforcement, and a take the limit would have refused wrote nothing. So
// used, remaining and the counts of shadow_denied are what enforcement
// would produce, and switching the policy to enforce continues from the
// same state.
func (o *Outcome) applyShadow(shadow bool) {
	if !shadow || o.Op != protocol.OpTake || o.Failed() {
		return
	}
	o.Shadow, o.ShadowAllowed = true, o.Allowed
	o.Allowed, o.RetryAfterMS = true, 0
}
