package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
	"go.uber.org/zap"

	"quotad/luascript"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

// ErrWaitedTooLong answers requests whose deadline passed while they
// waited for earlier batches (UNAVAILABLE, not run).
var ErrWaitedTooLong = errors.New("redis did not answer earlier calls within the deadline")

// errClosed answers a decision that came after the dispatcher closed: the
// sidecar has shut down and sent it nowhere.
var errClosed = errors.New("the sidecar shut down: the request was not run")

// transientReplies are Redis error replies that mean "not now": the request
// was not run (or ran without writing) and may succeed later.
var transientReplies = []string{"LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "OOM", "NOREPLICAS", "MISCONF"}

func malformedReply(msg string) error {
	return &luascript.Error{Code: luascript.CodeMalformedReply, Message: msg}
}

// failure is what an error means to each that reads it: the reply, the
// metrics, the log and the breaker. classify is the one place that says.
type failure struct {
	code    protocol.Code // the reply's error code
	message string
	// unknown: the call may have run, so a take's or settle's reply says
	// that its outcome is unknown.
	unknown bool
	// kind is the error's quotad_redis_errors_total label: timeout,
	// connection or refused; "" when it is no Redis command's failure.
	kind string
	// health is what the breaker of the Redis that serves the call's key
	// learns: up when Redis answered (even with an error reply), down when
	// it did not answer a call that had time at Redis, none when the
	// call says nothing of Redis (not sent, or given up by its caller).
	health store.Health
	// logged is the error log line of an error that is the operator's
	// business (INTERNAL); "" for the client's.
	logged string
}

// unknownOutcome ends the message of a take or settle that may have run.
const unknownOutcome = ": the outcome is unknown; retry with the same request_id"

// classify says what err, the error of a decision or of one Redis command,
// means. t is the timing of the script call that failed (nil when none
// was sent): only a call that had time at Redis and still did not answer
// counts against Redis's health (trip.fair). Only a typed script error
// is a definite answer; a timeout or a lost connection leaves the outcome
// of a take unknown.
func (d *Dispatcher) classify(err error, t *trip) failure {
	if err == nil {
		return failure{health: store.HealthUp}
	}
	if pe, ok := errors.AsType[*protocol.Error](err); ok {
		return failure{code: pe.Code, message: pe.Message}
	}
	if errors.Is(err, luascript.ErrMalformedReply) {
		return failure{code: protocol.CodeInternal, message: err.Error(), unknown: true, health: store.HealthUp, logged: "malformed script reply"}
	}
	if le, ok := errors.AsType[*luascript.Error](err); ok {
		switch code := protocol.Code(le.Code); code {
		case protocol.CodeInvalid, protocol.CodeConflict, protocol.CodePolicy, protocol.CodeWrongType, protocol.CodeRequestIDsFull:
			return failure{code: code, message: le.Message, health: store.HealthUp}
		}
		return failure{code: protocol.CodeInternal, message: err.Error(), health: store.HealthUp, logged: "unexpected script error"}
	}
	switch {
	case errors.Is(err, errClosed):
		return failure{code: protocol.CodeShuttingDown, message: err.Error()}
	case errors.Is(err, context.Canceled) && d.shutting():
		return failure{code: protocol.CodeShuttingDown, message: "the sidecar shut down before redis answered", unknown: true}
	case errors.Is(err, luascript.ErrNotLoaded):
		// NOSCRIPT ran nothing, and the call was not sent again.
		return failure{code: protocol.CodeUnavailable, message: err.Error() + ": the request was not run"}
	case errors.Is(err, context.DeadlineExceeded):
		f := failure{code: protocol.CodeUnavailable, message: "redis did not answer in time", unknown: true, kind: "timeout"}
		if t != nil && d.fair(held(err, t)) {
			f.health = store.HealthDown
		}
		return f
	case errors.Is(err, store.ErrNotConnected), errors.Is(err, ErrWaitedTooLong):
		return failure{code: protocol.CodeUnavailable, message: err.Error() + ": the request was not run"}
	case errors.Is(err, store.ErrBreakerOpen):
		// On a Cluster the message names the node that is down.
		return failure{code: protocol.CodeUnavailable, message: err.Error()}
	case isRedisReply(err):
		msg := redisMessage(err)
		if strings.HasPrefix(msg, "OOM") {
			// The script's first write is refused before anything is
			// written, so the outcome is known.
			return failure{code: protocol.CodeUnavailable, message: "redis is out of memory (maxmemory): nothing was written: " + msg,
				kind: "refused", health: store.HealthUp}
		}
		for _, p := range transientReplies {
			if strings.HasPrefix(msg, p) {
				return failure{code: protocol.CodeUnavailable, message: "redis refused the request: " + msg, kind: "refused", health: store.HealthUp}
			}
		}
		if strings.HasPrefix(msg, "WRONGTYPE") {
			return failure{code: protocol.CodeWrongType, message: msg, health: store.HealthUp}
		}
		return failure{code: protocol.CodeInternal, message: "redis: " + msg, health: store.HealthUp, logged: "unexpected redis error"}
	}
	f := failure{code: protocol.CodeUnavailable, message: fmt.Sprintf("redis unreachable (%v)", err), unknown: true}
	if !errors.Is(err, context.Canceled) {
		// A caller that gave up says nothing about Redis.
		f.kind, f.health = "connection", store.HealthDown
	}
	return f
}

// fair reports whether a call had time enough at Redis for its running
// out to say that Redis is slow: its deadline was --redis-timeout's, not a
// request's shorter one, and it waited inside quotad no longer than the
// batcher's patience before it was sent, so that it had at least three
// quarters of the deadline at Redis. A call that waited longer (every
// runner busy) had less, and its running out says that the round trip is
// longer than what was left, not that Redis failed: a steady latency below
// three quarters of the deadline never counts against Redis.
func (d *Dispatcher) fair(t *trip) bool {
	return !t.own && t.sent.Sub(t.queued) <= d.patience()
}

// held is t, with when the call was last sent when the script loader held
// it back (luascript.HeldError): the wait for its script is time inside
// quotad, not at Redis.
func held(err error, t *trip) *trip {
	if at := luascript.SentAt(err); !at.IsZero() {
		h := *t
		h.sent = at
		return &h
	}
	return t
}

// fail makes o the error answer to err; its error log line, if any, has
// the fields trace too.
func (d *Dispatcher) fail(o *Outcome, err error, trace ...zap.Field) {
	f := d.classify(err, nil)
	if f.logged != "" {
		d.log.Error(f.logged, append([]zap.Field{zap.Error(err), zap.Stringer(keyOp, o.Op)}, trace...)...)
	}
	msg := f.message
	if f.unknown && (o.Op == protocol.OpTake || o.Op == protocol.OpSettle) {
		msg += unknownOutcome
	}
	o.fail(f.code, msg)
}

// end answers dec, which Redis did not decide, with err, and hands it
// back: every failure of a decision ends here.
func (d *Dispatcher) end(dec *Decision, err error) {
	d.undecided(dec, err)
	d.finish(dec)
}

// undecided answers a request that Redis did not decide: fail's answer,
// which a take whose checks' policies all say on_unavailable allow or deny
// turns, when it is UNAVAILABLE (whatever its cause: not connected, the
// breaker, a timeout, a refusal), into a take marked degraded, each check
// as its policy says. The config in force when the request was resolved
// decides the policies' modes.
func (d *Dispatcher) undecided(dec *Decision, err error) {
	o := &dec.Out
	d.fail(o, err, dec.traceLog()...)
	if o.Op != protocol.OpTake || o.Code != protocol.CodeUnavailable {
		return
	}
	for i := range dec.checks {
		switch dec.checks[i].limit.OnUnavailable {
		case policy.OnUnavailableAllow, policy.OnUnavailableDeny:
		default:
			return
		}
	}
	o.Code, o.Message, o.Degraded = "", "", true
	// The earliest the sidecar may know more: its next probe of Redis.
	retry := max(d.store.ProbeInterval().Milliseconds(), 1)
	for i := range dec.checks {
		l, oc := &dec.checks[i].limit, dec.out(i)
		// Nothing is known of the state: the answer counts nothing as used.
		*oc = oc.fresh()
		oc.Remaining, oc.Degraded = oc.Limit, true
		oc.Allowed = l.OnUnavailable == policy.OnUnavailableAllow
		if !oc.Allowed {
			oc.RetryAfterMS = retry
		}
		// A shadow policy still never refuses: its degraded verdict goes
		// to shadow_allowed like a real one.
		oc.applyShadow(l.Shadow)
	}
	dec.verdict()
}

// observe feeds the result of a call on key, at the timing t, to the
// store's health (on a Cluster, the health of the node that serves key).
func (d *Dispatcher) observe(key string, err error, t *trip) {
	if h := d.classify(err, t).health; h != store.HealthNone {
		d.store.Observe(key, held(err, t).sent, h, err)
	}
}

// isRedisReply reports whether err is an error reply from Redis itself, as
// opposed to a transport failure.
func isRedisReply(err error) bool {
	_, ok := errors.AsType[*rueidis.RedisError](err)
	return ok
}

func redisMessage(err error) string {
	if re, ok := errors.AsType[*rueidis.RedisError](err); ok {
		return re.Error()
	}
	return err.Error()
}
