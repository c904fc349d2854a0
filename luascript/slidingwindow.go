package luascript

import (
	"context"
	_ "embed"
	"strconv"

	"github.com/redis/rueidis"
)

var (
	//go:embed sliding_window_take.lua
	slidingWindowTakeBody string
	//go:embed sliding_window_peek.lua
	slidingWindowPeekBody string

	slidingWindowTake = newScript("sliding_window_take.lua", slidingWindowTakeBody, &slidingWindowTakeContract)
	slidingWindowPeek = newScript("sliding_window_peek.lua", slidingWindowPeekBody, &slidingWindowPeekContract)
)

// SlidingWindowKey is the key of the sliding window that (policy, subject)
// counts against, laid out as FixedWindowKey.
func SlidingWindowKey(prefix, policy, subject string) string {
	return layoutKey(prefix, "sw", policy, subject)
}

// SlidingWindowArgs is one decision on a sliding window. The caller
// validates; the bounds are checked again here and in the script.
type SlidingWindowArgs struct {
	Key      string
	Limit    int64 // 1..MaxLimit
	WindowMS int64 // 1..MaxWindowMS
	Cost     int64 // 1..Limit
	// RequestID makes the take idempotent for as long as it counts (until
	// the end of the period after the one it was counted in): "" for none.
	RequestID string
	// Strict is for inline limits: a live window of another limit or
	// window is ErrPolicy. A named policy's new limit applies at once.
	Strict        bool
	MaxRequestIDs int64 // 1..MaxRequestIDsSize
}

// SlidingWindowResult is the decision.
type SlidingWindowResult struct {
	Allowed bool
	// Replay: RequestID was accepted, and still counts, with the same
	// cost; nothing was consumed.
	Replay bool
	// Used is the estimate of the use in the last window right after the
	// decision, rounded up; for a replay, right after the original
	// acceptance.
	Used int64
	// ResetMS is until the whole use has slid out; 0 for no use.
	ResetMS int64
	// RetryAfterMS is, when denied, until a take of Cost fits if nothing
	// else is taken meanwhile.
	RetryAfterMS int64
	// Healed: the key had no TTL and was given one.
	Healed bool
}

// SlidingWindowTake makes one atomic decision on the sliding window at
// a.Key, timed by Redis's clock. A denial writes nothing. Errors are as for
// FixedWindowTake.
func SlidingWindowTake(ctx context.Context, c rueidis.Client, a SlidingWindowArgs) (SlidingWindowResult, error) {
	call, err := SlidingWindowTakeCall(a)
	if err != nil {
		return SlidingWindowResult{}, err
	}
	return ParseSlidingWindowTake(call.Exec(ctx, c))
}

// SlidingWindowTakeCall validates a sliding window take and builds its
// script call, for Call.Exec or ExecMulti; ParseSlidingWindowTake reads the
// result.
func SlidingWindowTakeCall(a SlidingWindowArgs) (Call, error) {
	err := validateTake(TakeArgs{
		Key: a.Key, Limit: a.Limit, WindowMS: a.WindowMS, Cost: a.Cost,
		RequestID: a.RequestID, MaxRequestIDs: a.MaxRequestIDs,
	})
	if err != nil {
		return Call{}, err
	}
	return oneKey(slidingWindowTake, a.Key,
		decimal(a.Limit),
		decimal(a.WindowMS),
		strconv.FormatInt(a.Cost, 10),
		decimal(a.MaxRequestIDs),
		flag(a.Strict),
		a.RequestID,
	), nil
}

// ParseSlidingWindowTake reads the result of a sliding window take's call.
// Its errors are SlidingWindowTake's.
func ParseSlidingWindowTake(res rueidis.RedisResult) (SlidingWindowResult, error) {
	const op = "sliding window take"
	if err := res.Error(); err != nil {
		return SlidingWindowResult{}, replyError(op, err)
	}
	var v [6]int64
	if err := ints(op, res, v[:]); err != nil {
		return SlidingWindowResult{}, err
	}
	allowed, replay, used, reset, retry, healed := v[0], v[1], v[2], v[3], v[4], v[5]
	if !isFlag(allowed) || !isFlag(replay) || !isFlag(healed) || replay > allowed ||
		used < 0 || used > 2*MaxLimit || reset < 0 || retry < 0 || (allowed == 1) != (retry == 0) {
		return SlidingWindowResult{}, malformed(op, "reply %v", v)
	}
	return SlidingWindowResult{
		Allowed: allowed == 1, Replay: replay == 1, Used: used,
		ResetMS: reset, RetryAfterMS: retry, Healed: healed == 1,
	}, nil
}

// SlidingWindowPeekArgs names a sliding window to read.
type SlidingWindowPeekArgs struct {
	Key      string
	Limit    int64
	WindowMS int64
	Strict   bool
}

// SlidingWindowPeekResult is a sliding window's state now.
type SlidingWindowPeekResult struct {
	Used    int64 // the estimate, rounded up
	ResetMS int64 // until the whole use has slid out; 0 for none
}

// SlidingWindowPeek reads the sliding window at a.Key without writing
// anything.
func SlidingWindowPeek(ctx context.Context, c rueidis.Client, a SlidingWindowPeekArgs) (SlidingWindowPeekResult, error) {
	call, err := SlidingWindowPeekCall(a)
	if err != nil {
		return SlidingWindowPeekResult{}, err
	}
	return ParseSlidingWindowPeek(call.Exec(ctx, c))
}

// SlidingWindowPeekCall validates a sliding window peek and builds its
// script call; ParseSlidingWindowPeek reads the result.
func SlidingWindowPeekCall(a SlidingWindowPeekArgs) (Call, error) {
	if err := validateWindow(a.Key, a.Limit, a.WindowMS); err != nil {
		return Call{}, err
	}
	return oneKey(slidingWindowPeek, a.Key,
		decimal(a.Limit),
		decimal(a.WindowMS),
		flag(a.Strict),
	), nil
}

// ParseSlidingWindowPeek reads the result of a sliding window peek's call.
// Its errors are SlidingWindowPeek's.
func ParseSlidingWindowPeek(res rueidis.RedisResult) (SlidingWindowPeekResult, error) {
	const op = "sliding window peek"
	if err := res.Error(); err != nil {
		return SlidingWindowPeekResult{}, replyError(op, err)
	}
	var v [2]int64
	if err := ints(op, res, v[:]); err != nil {
		return SlidingWindowPeekResult{}, err
	}
	if v[0] < 0 || v[0] > 2*MaxLimit || v[1] < 0 {
		return SlidingWindowPeekResult{}, malformed(op, "reply %v", v)
	}
	return SlidingWindowPeekResult{Used: v[0], ResetMS: v[1]}, nil
}
