package dispatch

import (
	"strconv"
	"time"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// tokenBucket is a GCRA token bucket: rate tokens per period_ms refill a
// bucket of burst tokens, timed by Redis's clock.
type tokenBucket struct{}

func (tokenBucket) Name() string { return limits.TokenBucket }

func (tokenBucket) Key(prefix, policy, subject string) string {
	return luascript.TokenBucketKey(prefix, policy, subject)
}

func bucketOf(l *Limit) luascript.TokenBucket {
	b := l.Shape.(limits.Bucket)
	return luascript.TokenBucket{Rate: b.Rate, PeriodMS: b.PeriodMS, Burst: b.Burst}
}

func (tokenBucket) Call(req *protocol.Request, l *Limit, key string) (luascript.Call, error) {
	a := luascript.Args{Key: key, TokenBucket: bucketOf(l), Strict: l.strict()}
	switch req.Op {
	case protocol.OpPeek:
		return luascript.PeekCall(limits.TokenBucket, a)
	case protocol.OpTake:
		if req.Cost > a.Burst {
			// More than the bucket holds would be denied for ever.
			return luascript.Call{}, invalid("cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the burst " + strconv.FormatInt(a.Burst, 10))
		}
		a.Cost, a.RequestID, a.DedupeMS, a.MaxRequestIDs = req.Cost, req.RequestID, l.DedupeMS, l.MaxRequestIDs
		return luascript.TakeCall(limits.TokenBucket, a)
	}
	return luascript.Call{}, errNotALease(l)
}

// DeniedFor: a bucket gains tokens only with time, and other takes only
// spend them, so a take of this cost, or more, cannot fit before
// retry_after_ms. The script rounds that up from microseconds, and Redis
// ran the call after it was sent, so the denial holds one millisecond less
// than retry_after_ms from the send: it ends before the take could fit.
func (tokenBucket) DeniedFor(o *Outcome, cost int64) (time.Duration, int64) {
	if o.RetryAfterMS <= 1 {
		return 0, cost
	}
	return time.Duration(o.RetryAfterMS-1) * time.Millisecond, cost
}

// localState is what the bucket holds at now, for an answer from the local
// denial: it refills rate tokens per period until it is full at full, so
// the tokens missing are those of the time left until then. It never
// reports fewer tokens than Redis would: full is counted from before the
// call that found the denial.
func (tokenBucket) localState(shape limits.Shape, full, now time.Time) (used, remaining int64) {
	b := shape.(limits.Bucket)
	left := max(full.Sub(now), 0).Microseconds()
	missing := (left*b.Rate + b.PeriodMS*1000 - 1) / (b.PeriodMS * 1000) // rounded up: whole tokens only
	remaining = min(max(b.Burst-missing, 0), b.Burst)
	return b.Burst - remaining, remaining
}
