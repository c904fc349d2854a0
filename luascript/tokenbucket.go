package luascript

import (
	"context"
	_ "embed"
	"strconv"

	"github.com/redis/rueidis"

	"quotad/limits"
)

var (
	//go:embed token_bucket_take.lua
	tokenBucketTakeBody string
	//go:embed token_bucket_peek.lua
	tokenBucketPeekBody string

	tokenBucketTake = newScript("token_bucket_take.lua", tokenBucketTakeBody)
	tokenBucketPeek = newScript("token_bucket_peek.lua", tokenBucketPeekBody)
)

// TokenBucket is a bucket's shape: it holds Burst tokens and refills Rate
// tokens every PeriodMS, one token at a time (GCRA).
type TokenBucket struct {
	Rate     int64 // tokens per period, 1..MaxLimit
	PeriodMS int64 // 1..MaxWindowMS
	Burst    int64 // bucket size, 1..MaxLimit
}

// RefillMS is how long an empty bucket takes to fill, rounded up to whole
// milliseconds (limits.Bucket.RefillMS).
func (b TokenBucket) RefillMS() int64 { return limits.Bucket(b).RefillMS() }

// Validate checks the bounds the scripts check (limits.ValidateTokenBucket).
// The refill time is bounded by MaxWindowMS, so every time a bucket stores
// fits a key's TTL.
func (b TokenBucket) Validate() error {
	return invalid(limits.ValidateTokenBucket(b.Rate, b.PeriodMS, b.Burst))
}

// TokenBucketArgs is one decision on a token bucket.
type TokenBucketArgs struct {
	Key string
	TokenBucket
	Cost int64 // 1..Burst
	// RequestID makes the take idempotent for DedupeMS after its
	// acceptance: "" for none.
	RequestID string
	DedupeMS  int64 // 1..MaxWindowMS
	// Strict is for inline limits: a live bucket of another shape is
	// ErrPolicy. A named policy's new shape applies at once.
	Strict        bool
	MaxRequestIDs int64 // 1..MaxRequestIDsSize
}

// TokenBucketResult is the decision.
type TokenBucketResult struct {
	Allowed bool
	// Replay: RequestID was accepted within its horizon with the same
	// cost; nothing was consumed.
	Replay bool
	// Remaining is whole tokens left after the decision; for a replay, right
	// after the original acceptance.
	Remaining int64
	// ResetMS is until the bucket is full again; 0 when it is.
	ResetMS int64
	// RetryAfterMS is, when denied, until Cost tokens are in the bucket.
	RetryAfterMS int64
	// Healed: the key had no TTL and was given one.
	Healed bool
}

// TokenBucketTake makes one atomic decision on the bucket at a.Key, timed by
// Redis's clock. A denial writes nothing. Errors are as for FixedWindowTake.
func TokenBucketTake(ctx context.Context, c rueidis.Client, a TokenBucketArgs) (TokenBucketResult, error) {
	call, err := TokenBucketTakeCall(a)
	if err != nil {
		return TokenBucketResult{}, err
	}
	r, err := ParseTokenBucketTake(call.Exec(ctx, c))
	if err == nil && r.Remaining > a.Burst {
		return TokenBucketResult{}, malformed("token bucket take", "remaining %d above the burst %d", r.Remaining, a.Burst)
	}
	return r, err
}

// TokenBucketTakeCall validates a token bucket take and builds its script
// call, for Call.Exec or ExecMulti; ParseTokenBucketTake reads the result.
func TokenBucketTakeCall(a TokenBucketArgs) (Call, error) {
	if err := validateTokenBucketTake(a); err != nil {
		return Call{}, err
	}
	return oneKey(tokenBucketTake, a.Key, decimal(a.Rate), decimal(a.PeriodMS), decimal(a.Burst),
		strconv.FormatInt(a.Cost, 10),
		decimal(a.DedupeMS),
		decimal(a.MaxRequestIDs),
		flag(a.Strict),
		a.RequestID,
	), nil
}

// ParseTokenBucketTake reads the result of a token bucket take's call. Its
// errors are TokenBucketTake's.
func ParseTokenBucketTake(res rueidis.RedisResult) (TokenBucketResult, error) {
	const op = "token bucket take"
	if err := res.Error(); err != nil {
		return TokenBucketResult{}, replyError(op, err)
	}
	var v [6]int64
	if err := ints(op, res, v[:]); err != nil {
		return TokenBucketResult{}, err
	}
	allowed, replay, remaining, reset, retry, healed := v[0], v[1], v[2], v[3], v[4], v[5]
	if !isFlag(allowed) || !isFlag(replay) || !isFlag(healed) || replay > allowed ||
		remaining < 0 || remaining > MaxLimit || reset < 0 || retry < 0 || (allowed == 1) != (retry == 0) {
		return TokenBucketResult{}, malformed(op, "reply %v", v)
	}
	return TokenBucketResult{
		Allowed: allowed == 1, Replay: replay == 1, Remaining: remaining,
		ResetMS: reset, RetryAfterMS: retry, Healed: healed == 1,
	}, nil
}

// TokenBucketPeekArgs names a bucket to read.
type TokenBucketPeekArgs struct {
	Key string
	TokenBucket
	Strict bool
}

// TokenBucketPeekResult is a bucket's state now.
type TokenBucketPeekResult struct {
	Remaining int64 // whole tokens in the bucket
	ResetMS   int64 // until it is full; 0 when it is
}

// TokenBucketPeek reads the bucket at a.Key without writing anything.
func TokenBucketPeek(ctx context.Context, c rueidis.Client, a TokenBucketPeekArgs) (TokenBucketPeekResult, error) {
	call, err := TokenBucketPeekCall(a)
	if err != nil {
		return TokenBucketPeekResult{}, err
	}
	r, err := ParseTokenBucketPeek(call.Exec(ctx, c))
	if err == nil && r.Remaining > a.Burst {
		return TokenBucketPeekResult{}, malformed("token bucket peek", "remaining %d above the burst %d", r.Remaining, a.Burst)
	}
	return r, err
}

// TokenBucketPeekCall validates a token bucket peek and builds its script
// call; ParseTokenBucketPeek reads the result.
func TokenBucketPeekCall(a TokenBucketPeekArgs) (Call, error) {
	if a.Key == "" {
		return Call{}, errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return Call{}, err
	}
	return oneKey(tokenBucketPeek, a.Key, decimal(a.Rate), decimal(a.PeriodMS), decimal(a.Burst), flag(a.Strict)), nil
}

// ParseTokenBucketPeek reads the result of a token bucket peek's call. Its
// errors are TokenBucketPeek's.
func ParseTokenBucketPeek(res rueidis.RedisResult) (TokenBucketPeekResult, error) {
	const op = "token bucket peek"
	if err := res.Error(); err != nil {
		return TokenBucketPeekResult{}, replyError(op, err)
	}
	var v [2]int64
	if err := ints(op, res, v[:]); err != nil {
		return TokenBucketPeekResult{}, err
	}
	if v[0] < 0 || v[0] > MaxLimit || v[1] < 0 {
		return TokenBucketPeekResult{}, malformed(op, "reply %v", v)
	}
	return TokenBucketPeekResult{Remaining: v[0], ResetMS: v[1]}, nil
}

func validateTokenBucketTake(a TokenBucketArgs) error {
	if a.Key == "" {
		return errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Cost < 1 || a.Cost > a.Burst {
		return &Error{Code: CodeInvalid, Message: "cost must be an integer from 1 to the burst"}
	}
	if err := limits.ValidateDuration("dedupe_ms", a.DedupeMS); err != nil {
		return invalid(err)
	}
	if err := limits.ValidateMaxRequestIDs(a.MaxRequestIDs); err != nil {
		return invalid(err)
	}
	return checkRequestID(a.RequestID, false)
}
