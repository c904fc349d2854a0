package sidecar

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/zap"

	"quotad/luascript"
	"quotad/protocol"
)

// limits is what a request is decided against once its policy is resolved.
type limits struct {
	policy   string // the named policy, or "" for inline limits
	limit    int64
	windowMS int64
	maxIDs   int64
	// The other algorithms' shape, set by setPolicy and setInline
	// (algorithms.go); algorithm is "" for the fixed window.
	algorithm string
	bucket    luascript.TokenBucket
	dedupeMS  int64
	leaseMS   int64
	shadow    bool // the policy's mode is shadow: see applyShadow
}

// handle runs one decoded request and appends its reply line to dst.
func (s *Server) handle(ctx context.Context, req *protocol.Request, dst []byte) (out []byte) {
	defer s.observeRequest(req, s.beginRequest(), len(dst), &out)
	switch req.Op {
	case protocol.OpPing:
		return protocol.AppendPing(dst, req.ID, protocol.PingReply{
			Store:      s.store.Kind(),
			RedisOK:    s.store.Up(),
			Version:    s.opts.Version,
			Ready:      s.ready(ctx) == nil,
			RedisError: errorText(s.store.LastError()),
		})
	case protocol.OpTake, protocol.OpPeek, protocol.OpRelease:
		return s.decide(ctx, req, dst)
	}
	return protocol.AppendError(dst, req.ID, protocol.CodeInternal, "unhandled op "+req.Op.String())
}

func (s *Server) resolve(req *protocol.Request) (limits, error) {
	var l limits
	if req.Policy != "" {
		p, ok := s.cfg.Load().Policies[req.Policy]
		if !ok {
			return l, &protocol.Error{Code: protocol.CodeUnknownPolicy, Message: "no policy named " + strconv.Quote(req.Policy) + " in the config"}
		}
		l = limits{policy: p.Name, limit: p.Limit, windowMS: p.WindowMS, maxIDs: p.MaxRequestIDs}
		l.setPolicy(p)
		l.shadow = p.Mode == ModeShadow
	} else {
		if !s.opts.AllowInline {
			return l, &protocol.Error{Code: protocol.CodeInvalid, Message: "inline limits are disabled on this sidecar: name a policy"}
		}
		l = limits{limit: req.Limit, windowMS: req.WindowMS, maxIDs: DefaultMaxRequestIDs}
		l.setInline(req)
	}
	if err := l.check(req); err != nil {
		return l, err
	}
	if req.Op == protocol.OpTake && req.Cost > l.limit {
		return l, &protocol.Error{Code: protocol.CodeInvalid, Message: "cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the limit " + strconv.FormatInt(l.limit, 10)}
	}
	return l, nil
}

func (s *Server) decide(ctx context.Context, req *protocol.Request, dst []byte) []byte {
	l, err := s.resolve(req)
	if err != nil {
		return protocol.AppendErr(dst, req.ID, err)
	}
	// A fixed window known to be exhausted is denied before the store is
	// asked for a client: that answer holds while Redis is down too.
	var w windowCall
	if l.algorithm == "" {
		var ok bool
		if w, dst, ok = s.prepareWindow(req, l, dst); !ok {
			return dst
		}
	}
	client, err := s.store.Client()
	if err == nil && l.algorithm == "" {
		err = s.store.Check(w.key)
	}
	if err != nil {
		return s.appendUndecided(dst, req, l, err)
	}
	client = s.instrument(client)
	timeout := s.timeout(req)
	// A caller's own short deadline says nothing about Redis's health.
	shortened := timeout < s.opts.RedisTimeout
	ctx, cancel := s.callContext(ctx, timeout)
	defer cancel()
	if l.algorithm != "" {
		return s.decideAlgorithm(ctx, client, req, l, shortened, dst)
	}
	return s.finishWindow(&w, w.call.Exec(ctx, client), shortened, dst)
}

// timeout is the Redis timeout of a request: the server's, or the request's
// timeout_ms when shorter.
func (s *Server) timeout(req *protocol.Request) time.Duration {
	if t := time.Duration(req.TimeoutMS) * time.Millisecond; t > 0 && t < s.opts.RedisTimeout {
		return t
	}
	return s.opts.RedisTimeout
}

// windowCall is a fixed-window take or peek between prepareWindow, which
// builds its script call, and finishWindow, which answers from the result.
// decide sends the call alone; a connection's batch (batch.go) sends the
// calls of several requests with one ExecMulti.
type windowCall struct {
	req  *protocol.Request
	l    limits
	key  string
	cfg  *Config // the config the local-deny check saw
	call luascript.Call
	err  error     // the call failed validation and is not sent
	sent time.Time // when a take was sent, for the local-deny entry
}

// prepareWindow builds the script call of a fixed-window take or peek whose
// limits are resolved. ok is false when the reply is already appended to dst:
// the window is known to be exhausted (localdeny.go).
func (s *Server) prepareWindow(req *protocol.Request, l limits, dst []byte) (w windowCall, out []byte, ok bool) {
	w = windowCall{req: req, l: l, key: luascript.FixedWindowKey(s.opts.KeyPrefix, l.policy, req.Subject)}
	strict := l.policy == ""
	if req.Op == protocol.OpPeek {
		w.call, w.err = luascript.PeekCall(luascript.PeekArgs{Key: w.key, Limit: l.limit, WindowMS: l.windowMS, Strict: strict})
		return w, dst, true
	}
	w.cfg = s.cfg.Load()
	if req.RequestID == "" {
		if reply, ok := s.deny.check(w.cfg, w.key, l, req.Cost, time.Now()); ok {
			return w, protocol.AppendTake(dst, req.ID, l.applyShadow(reply)), false
		}
	}
	w.call, w.err = luascript.TakeCall(luascript.TakeArgs{
		Key: w.key, Limit: l.limit, WindowMS: l.windowMS, Cost: req.Cost,
		RequestID: req.RequestID, Strict: strict, MaxRequestIDs: l.maxIDs,
	})
	w.sent = time.Now()
	return w, dst, true
}

// finishWindow answers a fixed-window take or peek from its call's result
// (ignored when the call failed validation): the store's health, a healed
// window's log line, the local-deny entry, shadow mode and on_unavailable.
func (s *Server) finishWindow(w *windowCall, res rueidis.RedisResult, shortened bool, dst []byte) []byte {
	req, l := w.req, w.l
	if req.Op == protocol.OpPeek {
		var r luascript.PeekResult
		err := w.err
		if err == nil {
			r, err = luascript.ParsePeek(res)
		}
		s.observe(w.key, err, shortened)
		if err != nil {
			return s.appendFailure(dst, req, err)
		}
		return protocol.AppendPeek(dst, req.ID, protocol.PeekReply{
			Limit: l.limit, Used: r.Used, Remaining: max(l.limit-r.Used, 0), ResetMS: max(r.ResetMS, 0),
		})
	}
	var r luascript.TakeResult
	err := w.err
	if err == nil {
		r, err = luascript.ParseTake(res)
	}
	s.observe(w.key, err, shortened)
	s.logHealed(r.Healed, err, l, w.key)
	if err != nil {
		return s.appendUndecided(dst, req, l, err)
	}
	s.deny.record(w.cfg, w.key, l, r.Allowed, r.Used, r.ResetMS, w.sent)
	reply := protocol.TakeReply{
		Allowed: r.Allowed, Replay: r.Replay, Limit: l.limit, Used: r.Used,
		Remaining: max(l.limit-r.Used, 0), ResetMS: r.ResetMS,
	}
	if !r.Allowed {
		// A fixed window frees capacity only when it ends.
		reply.RetryAfterMS = r.ResetMS
	}
	return protocol.AppendTake(dst, req.ID, l.applyShadow(reply))
}

// observe feeds the outcome of a call on key to the store's health: a typed
// script error is an answer from Redis, and a deadline the caller shortened
// with timeout_ms is not evidence that Redis is down.
func (s *Server) observe(key string, err error, shortened bool) {
	var le *luascript.Error
	switch {
	case errors.As(err, &le):
		err = nil
	case shortened && errors.Is(err, context.DeadlineExceeded):
		return
	}
	s.store.Observe(key, err)
}

// transientReplies are Redis error replies that mean "not now": the request
// was not run (or ran without writing) and may succeed later.
var transientReplies = []string{"LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "OOM", "NOREPLICAS", "MISCONF"}

// appendFailure maps a failed call to its error reply. Only a typed script
// error is a definite answer; a timeout or a lost connection leaves the
// outcome of a take unknown, and the message says so.
func (s *Server) appendFailure(dst []byte, req *protocol.Request, err error) []byte {
	unknown := ""
	if req.Op == protocol.OpTake {
		unknown = ": the outcome is unknown; retry with the same request_id"
	}
	if errors.Is(err, luascript.ErrMalformedReply) {
		s.log.Error("malformed script reply", zap.Error(err), zap.Stringer(keyOp, req.Op))
		return protocol.AppendError(dst, req.ID, protocol.CodeInternal, err.Error()+unknown)
	}
	var le *luascript.Error
	if errors.As(err, &le) {
		code := protocol.Code(le.Code)
		switch code {
		case protocol.CodeInvalid, protocol.CodeConflict, protocol.CodePolicy, protocol.CodeWrongType, protocol.CodeRequestIDsFull:
			return protocol.AppendError(dst, req.ID, code, le.Message)
		}
		s.log.Error("unexpected script error", zap.Error(err), zap.Stringer(keyOp, req.Op))
		return protocol.AppendError(dst, req.ID, protocol.CodeInternal, err.Error())
	}
	switch {
	case errors.Is(err, context.Canceled) && s.shutting.Load():
		return protocol.AppendError(dst, req.ID, protocol.CodeShuttingDown, "the sidecar shut down before redis answered"+unknown)
	case errors.Is(err, context.DeadlineExceeded):
		return protocol.AppendError(dst, req.ID, protocol.CodeUnavailable, "redis did not answer in time"+unknown)
	case errors.Is(err, ErrNotConnected), errors.Is(err, errWaitedTooLong):
		return protocol.AppendError(dst, req.ID, protocol.CodeUnavailable, err.Error()+": the request was not run")
	case errors.Is(err, ErrBreakerOpen):
		// On a Cluster the message names the node that is down.
		return protocol.AppendError(dst, req.ID, protocol.CodeUnavailable, err.Error())
	case isRedisReply(err):
		msg := redisMessage(err)
		if strings.HasPrefix(msg, "OOM") {
			// The script's first write is refused before anything is
			// written, so the outcome is known.
			return protocol.AppendError(dst, req.ID, protocol.CodeUnavailable, "redis is out of memory (maxmemory): nothing was written: "+msg)
		}
		for _, p := range transientReplies {
			if strings.HasPrefix(msg, p) {
				return protocol.AppendError(dst, req.ID, protocol.CodeUnavailable, "redis refused the request: "+msg)
			}
		}
		if strings.HasPrefix(msg, "WRONGTYPE") {
			return protocol.AppendError(dst, req.ID, protocol.CodeWrongType, msg)
		}
		s.log.Error("unexpected redis error", zap.Error(err), zap.Stringer(keyOp, req.Op))
		return protocol.AppendError(dst, req.ID, protocol.CodeInternal, "redis: "+msg)
	default:
		return protocol.AppendError(dst, req.ID, protocol.CodeUnavailable, fmt.Sprintf("redis unreachable (%v)%s", err, unknown))
	}
}

func redisMessage(err error) string {
	var re *rueidis.RedisError
	if errors.As(err, &re) {
		return re.Error()
	}
	return err.Error()
}
