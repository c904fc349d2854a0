package luascript

import (
	"context"
	_ "embed"
	"strconv"

	"github.com/redis/rueidis"
)

// MaxLeases bounds a concurrency limit: every take reads the whole lease
// set, so this bounds the work and memory of one decision.
const MaxLeases = 100_000

var (
	//go:embed concurrency_take.lua
	concurrencyTakeSrc string
	//go:embed concurrency_peek.lua
	concurrencyPeekSrc string
	//go:embed concurrency_release.lua
	concurrencyReleaseSrc string

	// Not retried, as for the fixed window: see fixedWindowTake.
	concurrencyTake    = rueidis.NewLuaScript(concurrencyTakeSrc)
	concurrencyRelease = rueidis.NewLuaScript(concurrencyReleaseSrc)
	concurrencyPeek    = newReadOnlyScript(concurrencyPeekSrc)
)

// Leases is a lease set's shape.
type Leases struct {
	Limit   int64 // leases held at once, 1..MaxLeases
	LeaseMS int64 // how long a lease lives unless renewed, 1..MaxWindowMS
}

// Validate checks the bounds the scripts check.
func (l Leases) Validate() error {
	switch {
	case l.Limit < 1 || l.Limit > MaxLeases:
		return &Error{Code: CodeInvalid, Message: "limit must be a decimal in 1..100000"}
	case l.LeaseMS < 1 || l.LeaseMS > MaxWindowMS:
		return &Error{Code: CodeInvalid, Message: "lease_ms must be a decimal in 1..2678400000"}
	}
	return nil
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
	const op = "concurrency take"
	if a.Key == "" {
		return LeaseResult{}, errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return LeaseResult{}, err
	}
	if a.RequestID == "" || !validRequestID(a.RequestID) {
		return LeaseResult{}, &Error{Code: CodeInvalid, Message: "request id is required: 1..64 of A-Z a-z 0-9 _ -"}
	}
	args := []string{
		strconv.FormatInt(a.Limit, 10),
		strconv.FormatInt(a.LeaseMS, 10),
		flag(a.Strict),
		a.RequestID,
	}
	res := concurrencyTake.Exec(ctx, c, []string{a.Key}, args)
	if err := res.Error(); err != nil {
		return LeaseResult{}, replyError(op, err)
	}
	v, err := ints(op, res, 6)
	if err != nil {
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
	const op = "concurrency peek"
	if a.Key == "" {
		return LeasePeekResult{}, errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return LeasePeekResult{}, err
	}
	args := []string{strconv.FormatInt(a.Limit, 10), strconv.FormatInt(a.LeaseMS, 10), flag(a.Strict)}
	res := concurrencyPeek.Exec(ctx, c, []string{a.Key}, args)
	if err := res.Error(); err != nil {
		return LeasePeekResult{}, replyError(op, err)
	}
	v, err := ints(op, res, 2)
	if err != nil {
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
	const op = "concurrency release"
	if key == "" {
		return ReleaseResult{}, errEmptyKey
	}
	if requestID == "" || !validRequestID(requestID) {
		return ReleaseResult{}, &Error{Code: CodeInvalid, Message: "request id is required: 1..64 of A-Z a-z 0-9 _ -"}
	}
	res := concurrencyRelease.Exec(ctx, c, []string{key}, []string{requestID})
	if err := res.Error(); err != nil {
		return ReleaseResult{}, replyError(op, err)
	}
	v, err := ints(op, res, 2)
	if err != nil {
		return ReleaseResult{}, err
	}
	if !isFlag(v[0]) || v[1] < 0 {
		return ReleaseResult{}, malformed(op, "reply %v", v)
	}
	return ReleaseResult{Released: v[0] == 1, Used: v[1]}, nil
}
