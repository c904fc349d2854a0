package dispatch

import (
	"strconv"
	"time"

	"github.com/redis/rueidis"

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
	b := bucketOf(l)
	switch req.Op {
	case protocol.OpPeek:
		return luascript.TokenBucketPeekCall(luascript.TokenBucketPeekArgs{Key: key, TokenBucket: b, Strict: l.strict()})
	case protocol.OpTake:
		if req.Cost > b.Burst {
			// More than the bucket holds would be denied for ever.
			return luascript.Call{}, invalid("cost " + strconv.FormatInt(req.Cost, 10) + " exceeds the burst " + strconv.FormatInt(b.Burst, 10))
		}
		return luascript.TokenBucketTakeCall(luascript.TokenBucketArgs{
			Key: key, TokenBucket: b, Cost: req.Cost, RequestID: req.RequestID,
			DedupeMS: l.DedupeMS, Strict: l.strict(), MaxRequestIDs: l.MaxRequestIDs,
		})
	}
	return luascript.Call{}, errNotALease(l)
}

func (tokenBucket) Parse(req *protocol.Request, l *Limit, res rueidis.RedisResult, o *Outcome) error {
	if req.Op == protocol.OpPeek {
		r, err := luascript.ParseTokenBucketPeek(res)
		if err != nil {
			return err
		}
		o.Used, o.Remaining, o.ResetMS = o.Limit-r.Remaining, r.Remaining, r.ResetMS
		return nil
	}
	r, err := luascript.ParseTokenBucketTake(res)
	o.Healed = r.Healed
	if err != nil {
		return err
	}
	if r.Remaining > o.Limit {
		return malformedReply("token bucket take: remaining " + strconv.FormatInt(r.Remaining, 10) + " above the burst")
	}
	o.Allowed, o.Replay, o.Used, o.Remaining = r.Allowed, r.Replay, o.Limit-r.Remaining, r.Remaining
	o.ResetMS, o.RetryAfterMS = r.ResetMS, r.RetryAfterMS
	return nil
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
