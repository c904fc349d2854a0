package luascript

import (
	"context"
	_ "embed"
	"strconv"

	"github.com/redis/rueidis"
)

var (
	//go:embed token_bucket_take.lua
	tokenBucketTakeSrc string
	//go:embed token_bucket_peek.lua
	tokenBucketPeekSrc string

	// Not retried, as for the fixed window: see fixedWindowTake.
	tokenBucketTake = rueidis.NewLuaScript(tokenBucketTakeSrc)
	tokenBucketPeek = newReadOnlyScript(tokenBucketPeekSrc)
)

// TokenBucket is a bucket's shape: it holds Burst tokens and refills Rate
// tokens every PeriodMS, one token at a time (GCRA).
type TokenBucket struct {
	Rate     int64 // tokens per period, 1..MaxLimit
	PeriodMS int64 // 1..MaxWindowMS
	Burst    int64 // bucket size, 1..MaxLimit
}

// RefillMS is how long an empty bucket takes to fill, rounded up to whole
// milliseconds.
func (b TokenBucket) RefillMS() int64 {
	return (b.Burst*b.PeriodMS + b.Rate - 1) / b.Rate
}

// Validate checks the bounds the scripts check. The refill time is bounded
// by MaxWindowMS, so every time a bucket stores fits a key's TTL.
func (b TokenBucket) Validate() error {
	switch {
	case b.Rate < 1 || b.Rate > MaxLimit:
		return &Error{Code: CodeInvalid, Message: "rate must be a decimal in 1..1000000000"}
	case b.PeriodMS < 1 || b.PeriodMS > MaxWindowMS:
		return &Error{Code: CodeInvalid, Message: "period_ms must be a decimal in 1..2678400000"}
	case b.Burst < 1 || b.Burst > MaxLimit:
		return &Error{Code: CodeInvalid, Message: "burst must be a decimal in 1..1000000000"}
	case b.Burst*b.PeriodMS > MaxWindowMS*b.Rate: // both below 2^62
		return &Error{Code: CodeInvalid, Message: "burst * period_ms / rate (the refill time) must be at most 2678400000 ms"}
	}
	return nil
}

func (b TokenBucket) args() []string {
	return []string{
		strconv.FormatInt(b.Rate, 10),
		strconv.FormatInt(b.PeriodMS, 10),
		strconv.FormatInt(b.Burst, 10),
	}
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
	const op = "token bucket take"
	if err := validateTokenBucketTake(a); err != nil {
		return TokenBucketResult{}, err
	}
	args := append(a.args(),
		strconv.FormatInt(a.Cost, 10),
		strconv.FormatInt(a.DedupeMS, 10),
		strconv.FormatInt(a.MaxRequestIDs, 10),
		flag(a.Strict),
		a.RequestID,
	)
	res := tokenBucketTake.Exec(ctx, c, []string{a.Key}, args)
	if err := res.Error(); err != nil {
		return TokenBucketResult{}, replyError(op, err)
	}
	v, err := ints(op, res, 6)
	if err != nil {
		return TokenBucketResult{}, err
	}
	allowed, replay, remaining, reset, retry, healed := v[0], v[1], v[2], v[3], v[4], v[5]
	if !isFlag(allowed) || !isFlag(replay) || !isFlag(healed) || replay > allowed ||
		remaining < 0 || remaining > a.Burst || reset < 0 || retry < 0 || (allowed == 1) != (retry == 0) {
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
	const op = "token bucket peek"
	if a.Key == "" {
		return TokenBucketPeekResult{}, errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return TokenBucketPeekResult{}, err
	}
	res := tokenBucketPeek.Exec(ctx, c, []string{a.Key}, append(a.args(), flag(a.Strict)))
	if err := res.Error(); err != nil {
		return TokenBucketPeekResult{}, replyError(op, err)
	}
	v, err := ints(op, res, 2)
	if err != nil {
		return TokenBucketPeekResult{}, err
	}
	if v[0] < 0 || v[0] > a.Burst || v[1] < 0 {
		return TokenBucketPeekResult{}, malformed(op, "reply %v", v)
	}
	return TokenBucketPeekResult{Remaining: v[0], ResetMS: v[1]}, nil
}

var errEmptyKey = &Error{Code: CodeInvalid, Message: "key must not be empty"}

func validateTokenBucketTake(a TokenBucketArgs) error {
	if a.Key == "" {
		return errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return err
	}
	switch {
	case a.Cost < 1 || a.Cost > a.Burst:
		return &Error{Code: CodeInvalid, Message: "cost must be a decimal in 1..burst"}
	case a.DedupeMS < 1 || a.DedupeMS > MaxWindowMS:
		return &Error{Code: CodeInvalid, Message: "dedupe_ms must be a decimal in 1..2678400000"}
	case a.MaxRequestIDs < 1 || a.MaxRequestIDs > MaxRequestIDsSize:
		return &Error{Code: CodeInvalid, Message: "max request ids must be a decimal in 1..1000000"}
	case !validRequestID(a.RequestID):
		return &Error{Code: CodeInvalid, Message: "request id must be 1..64 of A-Z a-z 0-9 _ -"}
	}
	return nil
}
