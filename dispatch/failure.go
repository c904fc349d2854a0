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

// fail makes o the error answer to a call that failed with err. Only a
// typed script error is a definite answer; a timeout or a lost connection
// leaves the outcome of a take unknown, and the message says so.
func (d *Dispatcher) fail(o *Outcome, err error) {
	unknown := ""
	if o.Op == protocol.OpTake || o.Op == protocol.OpSettle {
		unknown = ": the outcome is unknown; retry with the same request_id"
	}
	if pe, ok := errors.AsType[*protocol.Error](err); ok {
		o.fail(pe.Code, pe.Message)
		return
	}
	if errors.Is(err, luascript.ErrMalformedReply) {
		d.log.Error("malformed script reply", zap.Error(err), zap.Stringer(keyOp, o.Op))
		o.fail(protocol.CodeInternal, err.Error()+unknown)
		return
	}
	if le, ok := errors.AsType[*luascript.Error](err); ok {
		switch code := protocol.Code(le.Code); code {
		case protocol.CodeInvalid, protocol.CodeConflict, protocol.CodePolicy, protocol.CodeWrongType, protocol.CodeRequestIDsFull:
			o.fail(code, le.Message)
			return
		}
		d.log.Error("unexpected script error", zap.Error(err), zap.Stringer(keyOp, o.Op))
		o.fail(protocol.CodeInternal, err.Error())
		return
	}
	switch {
	case errors.Is(err, errClosed):
		o.fail(protocol.CodeShuttingDown, err.Error())
	case errors.Is(err, context.Canceled) && d.shutting():
		o.fail(protocol.CodeShuttingDown, "the sidecar shut down before redis answered"+unknown)
	case errors.Is(err, context.DeadlineExceeded):
		o.fail(protocol.CodeUnavailable, "redis did not answer in time"+unknown)
	case errors.Is(err, store.ErrNotConnected), errors.Is(err, ErrWaitedTooLong):
		o.fail(protocol.CodeUnavailable, err.Error()+": the request was not run")
	case errors.Is(err, store.ErrBreakerOpen):
		// On a Cluster the message names the node that is down.
		o.fail(protocol.CodeUnavailable, err.Error())
	case isRedisReply(err):
		msg := redisMessage(err)
		if strings.HasPrefix(msg, "OOM") {
			// The script's first write is refused before anything is
			// written, so the outcome is known.
			o.fail(protocol.CodeUnavailable, "redis is out of memory (maxmemory): nothing was written: "+msg)
			return
		}
		for _, p := range transientReplies {
			if strings.HasPrefix(msg, p) {
				o.fail(protocol.CodeUnavailable, "redis refused the request: "+msg)
				return
			}
		}
		if strings.HasPrefix(msg, "WRONGTYPE") {
			o.fail(protocol.CodeWrongType, msg)
			return
		}
		d.log.Error("unexpected redis error", zap.Error(err), zap.Stringer(keyOp, o.Op))
		o.fail(protocol.CodeInternal, "redis: "+msg)
	default:
		o.fail(protocol.CodeUnavailable, fmt.Sprintf("redis unreachable (%v)%s", err, unknown))
	}
}

// undecided answers a request that Redis did not decide: fail's answer,
// which a take of a policy with on_unavailable allow or deny turns, when it
// is UNAVAILABLE (whatever its cause: not connected, the breaker, a
// timeout, a refusal), into a take marked degraded. The config in force
// when the request was resolved decides the policy's mode.
func (d *Dispatcher) undecided(dec *Decision, err error) {
	if dec.multi != nil {
		d.undecidedMulti(dec, err)
		return
	}
	o := &dec.Out
	d.fail(o, err)
	l := &dec.limit
	if o.Op != protocol.OpTake || o.Code != protocol.CodeUnavailable ||
		l.OnUnavailable == "" || l.OnUnavailable == policy.OnUnavailableError {
		return
	}
	// Nothing is known of the state: the answer counts nothing as used.
	*o = Outcome{
		Op: o.Op, Algorithm: o.Algorithm, Policy: o.Policy, Limit: o.Limit, Remaining: o.Limit, Degraded: true,
		Headers: o.Headers, Shape: o.Shape,
	}
	if l.OnUnavailable == policy.OnUnavailableAllow {
		o.Allowed = true
	} else {
		// The earliest the sidecar may know more: its next probe of Redis.
		o.RetryAfterMS = max(d.store.ProbeInterval().Milliseconds(), 1)
	}
	// A shadow policy still never refuses: its degraded verdict goes to
	// shadow_allowed like a real one.
	o.applyShadow(l.Shadow)
}

// observe feeds the outcome of a call on key to the store's health (on a
// Cluster, the health of the node that serves key): a typed script error
// is an answer from Redis, and a deadline the caller shortened with
// timeout_ms is not evidence that Redis is down.
func (d *Dispatcher) observe(key string, err error, shortened bool) {
	switch {
	case err == nil:
	case isScriptError(err):
		err = nil
	case shortened && errors.Is(err, context.DeadlineExceeded):
		return
	}
	d.store.Observe(key, err)
}

// isScriptError reports whether err is a script's typed error, found
// without the allocation errors.As makes.
func isScriptError(err error) bool {
	_, ok := errors.AsType[*luascript.Error](err)
	return ok
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
