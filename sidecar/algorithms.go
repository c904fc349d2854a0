package sidecar

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/rueidis"
	"go.uber.org/zap"

	"quotad/luascript"
	"quotad/protocol"
)

// setPolicy takes a named policy's algorithm and shape. The fixed window
// leaves algorithm "", so decide keeps its own path for it.
func (l *limits) setPolicy(p *Policy) {
	if p.Algorithm == AlgorithmFixedWindow {
		return
	}
	l.algorithm = p.Algorithm
	l.bucket = luascript.TokenBucket{Rate: p.Rate, PeriodMS: p.PeriodMS, Burst: p.Burst}
	l.dedupeMS = p.DedupeMS
	l.leaseMS = p.LeaseMS
}

// setInline takes the algorithm and shape of a request's inline limits,
// which protocol.Decode has validated.
func (l *limits) setInline(req *protocol.Request) {
	switch req.InlineAlgorithm() {
	case AlgorithmTokenBucket:
		l.algorithm = AlgorithmTokenBucket
		l.bucket = luascript.TokenBucket{Rate: req.Rate, PeriodMS: req.PeriodMS, Burst: req.Burst}
		l.limit = req.Burst
		l.dedupeMS = l.bucket.RefillMS()
	case AlgorithmConcurrency:
		l.algorithm = AlgorithmConcurrency
		l.leaseMS = req.LeaseMS
	}
}

// check refuses what the resolved algorithm cannot do with the request.
func (l limits) check(req *protocol.Request) error {
	invalid := func(msg string) error { return &protocol.Error{Code: protocol.CodeInvalid, Message: msg} }
	switch {
	case req.Op == protocol.OpRelease && l.algorithm != AlgorithmConcurrency:
		return invalid("release frees a concurrency lease; this limit is " + l.algorithmName())
	case l.algorithm == AlgorithmConcurrency && req.Op == protocol.OpTake && req.RequestID == "":
		return invalid("a concurrency take needs a request_id: it names the lease")
	case l.algorithm == AlgorithmConcurrency && req.Op == protocol.OpTake && req.Cost != 1:
		return invalid("a concurrency take holds one lease: cost must be 1")
	case l.algorithm == AlgorithmTokenBucket && req.Op == protocol.OpTake && req.Cost > l.bucket.Burst:
		// More than the bucket holds would be denied for ever.
		return invalid("cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the burst " + strconv.FormatInt(l.bucket.Burst, 10))
	}
	return nil
}

func (l limits) algorithmName() string {
	if l.algorithm == "" {
		return AlgorithmFixedWindow
	}
	return l.algorithm
}

// decideAlgorithm runs a take, peek or release on a token bucket or a
// concurrency lease set; decide has resolved the limits and set the deadline.
func (s *Server) decideAlgorithm(ctx context.Context, client rueidis.Client, req *protocol.Request, l limits, shortened bool, dst []byte) []byte {
	strict := l.policy == ""
	switch l.algorithm {
	case AlgorithmTokenBucket:
		key := luascript.TokenBucketKey(s.opts.KeyPrefix, l.policy, req.Subject)
		if err := s.store.Check(key); err != nil {
			return s.appendUndecided(dst, req, l, err)
		}
		if req.Op == protocol.OpPeek {
			res, err := luascript.TokenBucketPeek(ctx, client, luascript.TokenBucketPeekArgs{Key: key, TokenBucket: l.bucket, Strict: strict})
			s.observe(key, err, shortened)
			if err != nil {
				return s.appendUndecided(dst, req, l, err)
			}
			return protocol.AppendPeek(dst, req.ID, protocol.PeekReply{
				Limit: l.limit, Used: l.limit - res.Remaining, Remaining: res.Remaining, ResetMS: res.ResetMS,
			})
		}
		res, err := luascript.TokenBucketTake(ctx, client, luascript.TokenBucketArgs{
			Key: key, TokenBucket: l.bucket, Cost: req.Cost, RequestID: req.RequestID,
			DedupeMS: l.dedupeMS, Strict: strict, MaxRequestIDs: l.maxIDs,
		})
		s.observe(key, err, shortened)
		s.logHealed(res.Healed, err, l, key)
		if err != nil {
			return s.appendUndecided(dst, req, l, err)
		}
		return protocol.AppendTake(dst, req.ID, l.applyShadow(protocol.TakeReply{
			Allowed: res.Allowed, Replay: res.Replay, Limit: l.limit, Used: l.limit - res.Remaining,
			Remaining: res.Remaining, ResetMS: res.ResetMS, RetryAfterMS: res.RetryAfterMS,
		}))

	case AlgorithmConcurrency:
		key := luascript.ConcurrencyKey(s.opts.KeyPrefix, l.policy, req.Subject)
		if err := s.store.Check(key); err != nil {
			return s.appendUndecided(dst, req, l, err)
		}
		shape := luascript.Leases{Limit: l.limit, LeaseMS: l.leaseMS}
		switch req.Op {
		case protocol.OpPeek:
			res, err := luascript.ConcurrencyPeek(ctx, client, luascript.LeasePeekArgs{Key: key, Leases: shape, Strict: strict})
			s.observe(key, err, shortened)
			if err != nil {
				return s.appendUndecided(dst, req, l, err)
			}
			return protocol.AppendPeek(dst, req.ID, protocol.PeekReply{
				Limit: l.limit, Used: res.Used, Remaining: max(l.limit-res.Used, 0), ResetMS: res.ResetMS,
			})
		case protocol.OpRelease:
			res, err := luascript.ConcurrencyRelease(ctx, client, key, req.RequestID)
			s.observe(key, err, shortened)
			if err != nil {
				return s.appendUndecided(dst, req, l, err)
			}
			return protocol.AppendRelease(dst, req.ID, protocol.ReleaseReply{
				Released: res.Released, Limit: l.limit, Used: res.Used, Remaining: max(l.limit-res.Used, 0),
			})
		}
		res, err := luascript.ConcurrencyTake(ctx, client, luascript.LeaseArgs{Key: key, Leases: shape, RequestID: req.RequestID, Strict: strict})
		s.observe(key, err, shortened)
		s.logHealed(res.Healed, err, l, key)
		if err != nil {
			return s.appendUndecided(dst, req, l, err)
		}
		reply := protocol.TakeReply{
			Allowed: res.Allowed, Replay: res.Replay, Limit: l.limit, Used: res.Used,
			Remaining: max(l.limit-res.Used, 0), ResetMS: res.ResetMS, RetryAfterMS: res.RetryAfterMS,
		}
		if res.Allowed {
			reply.LeaseMS = l.leaseMS
		}
		return protocol.AppendTake(dst, req.ID, l.applyShadow(reply))
	}
	return protocol.AppendError(dst, req.ID, protocol.CodeInternal, "unhandled algorithm "+strconv.Quote(l.algorithm))
}

// logHealed reports a key that had lost its TTL, as decide does for the
// fixed window.
func (s *Server) logHealed(healed bool, err error, l limits, key string) {
	var le *luascript.Error
	if healed || errors.As(err, &le) && le.Healed {
		s.log.Warn("restored the TTL of a quota key that had none", zap.String(keyPolicy, l.policy),
			zap.String(keyKey, key), zap.Int64(keyHealedTotal, s.healed.Add(1)))
	}
}
