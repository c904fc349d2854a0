package luascript

import (
	"context"
	_ "embed"

	"github.com/redis/rueidis"

	"quotad/limits"
)

// MaxLeases bounds a concurrency limit: every take reads the whole lease
// set, so this bounds the work and memory of one decision.
const MaxLeases = limits.MaxLeases

var (
	//go:embed concurrency_take.lua
	concurrencyTakeBody string
	//go:embed concurrency_peek.lua
	concurrencyPeekBody string
	//go:embed concurrency_release.lua
	concurrencyReleaseBody string

	concurrencyTake    = newScript("concurrency_take.lua", concurrencyTakeBody)
	concurrencyPeek    = newScript("concurrency_peek.lua", concurrencyPeekBody)
	concurrencyRelease = newScript("concurrency_release.lua", concurrencyReleaseBody)
)

// Leases is a lease set's shape.
type Leases struct {
	Limit   int64 // leases held at once, 1..MaxLeases
	LeaseMS int64 // how long a lease lives unless renewed, 1..MaxWindowMS
}

// Validate checks the bounds the scripts check (limits.ValidateConcurrency).
func (l Leases) Validate() error {
	return invalid(limits.ValidateConcurrency(l.Limit, l.LeaseMS))
}

// LeaseArgs is one acquisition or renewal of the lease RequestID.
type LeaseArgs struct {
	Key string
	Leases
	RequestID string // required: 1..MaxRequestIDLen of [A-Za-z0-9_-]
	// Strict is for inline limits: a live set of another shape is
	// ErrPolicy. A named policy's new shape applies at once.
	Strict bool
}

// LeaseResult is the decision.
type LeaseResult struct {
	Allowed bool
	// Replay: the lease was live and has been renewed for LeaseMS.
	Replay bool
	// Used counts live leases after the decision.
	Used int64
	// ResetMS is until the last live lease expires; 0 when none is held.
	ResetMS int64
	// RetryAfterMS is, when denied, until the first live lease expires.
	RetryAfterMS int64
	// Healed: the key had no TTL and was given one.
	Healed bool
}

// ConcurrencyTake acquires the lease a.RequestID on the set at a.Key, or
// renews it when it is live. Expired leases are reclaimed on the way.
// Errors are as for FixedWindowTake.
func ConcurrencyTake(ctx context.Context, c rueidis.Client, a LeaseArgs) (LeaseResult, error) {
	call, err := ConcurrencyTakeCall(a)
	if err != nil {
		return LeaseResult{}, err
	}
	return ParseConcurrencyTake(call.Exec(ctx, c))
}

// ConcurrencyTakeCall validates a lease take and builds its script call,
// for Call.Exec or ExecMulti; ParseConcurrencyTake reads the result.
func ConcurrencyTakeCall(a LeaseArgs) (Call, error) {
	if a.Key == "" {
		return Call{}, errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return Call{}, err
	}
	if err := checkRequestID(a.RequestID, true); err != nil {
		return Call{}, err
	}
	return oneKey(concurrencyTake, a.Key,
		decimal(a.Limit),
		decimal(a.LeaseMS),
		flag(a.Strict),
		a.RequestID,
	), nil
}

// ParseConcurrencyTake reads the result of a lease take's call. Its errors
// are ConcurrencyTake's.
func ParseConcurrencyTake(res rueidis.RedisResult) (LeaseResult, error) {
	const op = "concurrency take"
	if err := res.Error(); err != nil {
		return LeaseResult{}, replyError(op, err)
	}
	var v [6]int64
	if err := ints(op, res, v[:]); err != nil {
		return LeaseResult{}, err
	}
	allowed, replay, used, reset, retry, healed := v[0], v[1], v[2], v[3], v[4], v[5]
	if !isFlag(allowed) || !isFlag(replay) || !isFlag(healed) || replay > allowed || used < allowed ||
		reset < 0 || retry < 0 || (allowed == 1) != (retry == 0) || (allowed == 0 && retry == 0) {
		return LeaseResult{}, malformed(op, "reply %v", v)
	}
	return LeaseResult{
		Allowed: allowed == 1, Replay: replay == 1, Used: used,
		ResetMS: reset, RetryAfterMS: retry, Healed: healed == 1,
	}, nil
}

// LeasePeekArgs names a lease set to read.
type LeasePeekArgs struct {
	Key string
	Leases
	Strict bool
}

// LeasePeekResult is a lease set's state now.
type LeasePeekResult struct {
	Used    int64 // live leases
	ResetMS int64 // until the last of them expires; 0 when none is held
}

// ConcurrencyPeek reads the set at a.Key without writing anything.
func ConcurrencyPeek(ctx context.Context, c rueidis.Client, a LeasePeekArgs) (LeasePeekResult, error) {
	call, err := ConcurrencyPeekCall(a)
	if err != nil {
		return LeasePeekResult{}, err
	}
	return ParseConcurrencyPeek(call.Exec(ctx, c))
}

// ConcurrencyPeekCall validates a lease set peek and builds its script
// call; ParseConcurrencyPeek reads the result.
func ConcurrencyPeekCall(a LeasePeekArgs) (Call, error) {
	if a.Key == "" {
		return Call{}, errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return Call{}, err
	}
	return oneKey(concurrencyPeek, a.Key,
		decimal(a.Limit), decimal(a.LeaseMS), flag(a.Strict),
	), nil
}

// ParseConcurrencyPeek reads the result of a lease set peek's call. Its
// errors are ConcurrencyPeek's.
func ParseConcurrencyPeek(res rueidis.RedisResult) (LeasePeekResult, error) {
	const op = "concurrency peek"
	if err := res.Error(); err != nil {
		return LeasePeekResult{}, replyError(op, err)
	}
	var v [2]int64
	if err := ints(op, res, v[:]); err != nil {
		return LeasePeekResult{}, err
	}
	if v[0] < 0 || v[1] < 0 || (v[0] == 0) != (v[1] == 0) {
		return LeasePeekResult{}, malformed(op, "reply %v", v)
	}
	return LeasePeekResult{Used: v[0], ResetMS: v[1]}, nil
}

// ReleaseResult is the outcome of a release.
type ReleaseResult struct {
	// Released: a live lease of that name was freed. False when there was
	// none (expired, released before, never taken), which is not an error.
	Released bool
	Used     int64 // live leases left
}

// ConcurrencyRelease frees the lease requestID on the set at key. It is
// safe to repeat: a second release answers Released false.
func ConcurrencyRelease(ctx context.Context, c rueidis.Client, key, requestID string) (ReleaseResult, error) {
	call, err := ConcurrencyReleaseCall(key, requestID)
	if err != nil {
		return ReleaseResult{}, err
	}
	return ParseConcurrencyRelease(call.Exec(ctx, c))
}

// ConcurrencyReleaseCall validates a release and builds its script call;
// ParseConcurrencyRelease reads the result.
func ConcurrencyReleaseCall(key, requestID string) (Call, error) {
	if key == "" {
		return Call{}, errEmptyKey
	}
	if err := checkRequestID(requestID, true); err != nil {
		return Call{}, err
	}
	return oneKey(concurrencyRelease, key, requestID), nil
}

// ParseConcurrencyRelease reads the result of a release's call. Its errors
// are ConcurrencyRelease's.
func ParseConcurrencyRelease(res rueidis.RedisResult) (ReleaseResult, error) {
	const op = "concurrency release"
	if err := res.Error(); err != nil {
		return ReleaseResult{}, replyError(op, err)
	}
	var v [2]int64
	if err := ints(op, res, v[:]); err != nil {
		return ReleaseResult{}, err
	}
	if !isFlag(v[0]) || v[1] < 0 {
		return ReleaseResult{}, malformed(op, "reply %v", v)
	}
	return ReleaseResult{Released: v[0] == 1, Used: v[1]}, nil
}
