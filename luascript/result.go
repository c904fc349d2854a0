package luascript

import (
	"context"

	"github.com/redis/rueidis"
)

// Result is a script's answer, in one shape for every algorithm: each op's
// parser fills the fields its reply holds (ParseTake, ParsePeek,
// ParseSettle, ParseRelease), and every script of an op replies in the
// same layout, so one parser reads them all.
type Result struct {
	// Allowed (a take): the take was accepted. Replay (a take, a settle):
	// its request id was accepted (settled) before with the same cost;
	// nothing was consumed (changed), and the other fields are as right
	// after the original take (or as they are now, for a settle).
	Allowed bool
	Replay  bool
	// Used and Remaining: the state's use and what is left of its limit,
	// after the decision: a window's use (a sliding window's estimate,
	// rounded up), live leases, or a bucket's burst less its whole
	// tokens; Remaining is never below 0, Used may pass the limit (a
	// settle, a lowered named limit).
	Used      int64
	Remaining int64
	// ResetMS is until the state is fresh again: a fixed window's PTTL (a
	// peek: -1 for a window without a TTL, which the next take restores),
	// a calendar period's end, until a bucket is full, until the whole use
	// has slid out or the last lease expires; 0 for no state.
	ResetMS int64
	// RetryAfterMS is, when a take is denied, until a take of its cost
	// could fit; for a settle, what a take of 1 would be told.
	RetryAfterMS int64
	// Healed: the key had no TTL and was given one.
	Healed bool
	// Exists (a peek): the key holds state.
	Exists bool
	// Settled (a settle): the state holds the take and the settlement
	// applies to it; false, nothing to settle and nothing changed.
	// Reserved is the cost the take reserved, 0 when not Settled.
	Settled  bool
	Reserved int64
	// Released (a release): a live lease of that name was freed; false
	// when there was none (expired, released before, never taken), which
	// is not an error.
	Released bool
}

// ParseTake reads a take's reply, of any algorithm:
// {allowed, replay, used, remaining, reset_ms, retry_after_ms, healed},
// whose retry_after_ms and healed may be left out together when both are
// 0 (an allowed take that healed nothing: most decisions, whose replies
// Redis then writes and the sidecar reads two integers shorter).
// A refusal is an *Error and nothing was applied; any other error leaves
// the outcome unknown.
func ParseTake(res rueidis.RedisResult) (Result, error) {
	const op = "take"
	if err := res.Error(); err != nil {
		return Result{}, replyError(op, err)
	}
	var v [7]int64
	if err := ints(op, res, v[:], 5); err != nil {
		return Result{}, err
	}
	allowed, replay, used, remaining, reset, retry, healed := v[0], v[1], v[2], v[3], v[4], v[5], v[6]
	if !isFlag(allowed) || !isFlag(replay) || !isFlag(healed) || replay > allowed || !level(used, remaining) ||
		reset < 0 || retry < 0 || allowed == 1 && retry != 0 {
		return Result{}, malformed(op, "reply %v", v)
	}
	return Result{
		Allowed: allowed == 1, Replay: replay == 1, Used: used, Remaining: remaining,
		ResetMS: reset, RetryAfterMS: retry, Healed: healed == 1,
	}, nil
}

// ParsePeek reads a peek's reply, of any algorithm:
// {exists, used, remaining, reset_ms}.
func ParsePeek(res rueidis.RedisResult) (Result, error) {
	const op = "peek"
	if err := res.Error(); err != nil {
		return Result{}, replyError(op, err)
	}
	var v [4]int64
	if err := ints(op, res, v[:], 0); err != nil {
		return Result{}, err
	}
	exists, used, remaining, reset := v[0], v[1], v[2], v[3]
	if !isFlag(exists) || !level(used, remaining) || reset < -1 || exists == 0 && (used != 0 || reset < 0) {
		return Result{}, malformed(op, "reply %v", v)
	}
	return Result{Exists: exists == 1, Used: used, Remaining: remaining, ResetMS: reset}, nil
}

// ParseSettle reads a settle's reply, of any algorithm: {settled, replay,
// reserved, used, remaining, reset_ms, retry_after_ms, healed}.
func ParseSettle(res rueidis.RedisResult) (Result, error) {
	const op = "settle"
	if err := res.Error(); err != nil {
		return Result{}, replyError(op, err)
	}
	var v [8]int64
	if err := ints(op, res, v[:], 0); err != nil {
		return Result{}, err
	}
	settled, replay, reserved, used, remaining, reset, retry, healed := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
	if !isFlag(settled) || !isFlag(replay) || !isFlag(healed) || replay > settled ||
		(settled == 1) != (reserved > 0) || reserved > MaxLimit || !level(used, remaining) || reset < 0 || retry < 0 {
		return Result{}, malformed(op, "reply %v", v)
	}
	return Result{
		Settled: settled == 1, Replay: replay == 1, Reserved: reserved, Used: used, Remaining: remaining,
		ResetMS: reset, RetryAfterMS: retry, Healed: healed == 1,
	}, nil
}

// ParseRelease reads a release's reply: {released, used}.
func ParseRelease(res rueidis.RedisResult) (Result, error) {
	const op = "release"
	if err := res.Error(); err != nil {
		return Result{}, replyError(op, err)
	}
	var v [2]int64
	if err := ints(op, res, v[:], 0); err != nil {
		return Result{}, err
	}
	if !isFlag(v[0]) || v[1] < 0 {
		return Result{}, malformed(op, "reply %v", v)
	}
	return Result{Released: v[0] == 1, Used: v[1]}, nil
}

// level reports whether used and remaining are in the bounds every state
// keeps: a sliding window's estimate reaches twice its limit.
func level(used, remaining int64) bool {
	return used >= 0 && used <= 2*MaxLimit && remaining >= 0 && remaining <= MaxLimit
}

// Take makes one atomic decision of algorithm on a.Key: TakeCall, Exec and
// ParseTake. It never retries: after a lost reply only the caller knows
// whether a request id makes a second attempt safe.
func Take(ctx context.Context, c rueidis.Client, algorithm string, a Args) (Result, error) {
	return exec(ctx, c, ParseTake)(TakeCall(algorithm, a))
}

// Peek reads the state at a.Key without writing anything: PeekCall, Exec
// and ParsePeek.
func Peek(ctx context.Context, c rueidis.Client, algorithm string, a Args) (Result, error) {
	return exec(ctx, c, ParsePeek)(PeekCall(algorithm, a))
}

// Settle settles the take a.RequestID on a.Key: SettleCall, Exec and
// ParseSettle.
func Settle(ctx context.Context, c rueidis.Client, algorithm string, a Args) (Result, error) {
	return exec(ctx, c, ParseSettle)(SettleCall(algorithm, a))
}

// Release frees the lease requestID of the lease set at key. It is safe
// to repeat: a second release answers Released false.
func Release(ctx context.Context, c rueidis.Client, key, requestID string) (Result, error) {
	return exec(ctx, c, ParseRelease)(ReleaseCall(key, requestID))
}

func exec(ctx context.Context, c rueidis.Client, parse func(rueidis.RedisResult) (Result, error)) func(Call, error) (Result, error) {
	return func(call Call, err error) (Result, error) {
		if err != nil {
			return Result{}, err
		}
		return parse(call.Exec(ctx, c))
	}
}

// ints reads a reply that must be an array of len(v) integers into v,
// which the caller keeps on its stack, or of short (when not 0), whose
// integers left out at the end are 0.
func ints(op string, res rueidis.RedisResult, v []int64, short int) error {
	arr, err := res.ToArray()
	if err != nil {
		return malformed(op, "%v", err)
	}
	if len(arr) != len(v) && (short == 0 || len(arr) != short) {
		if short == 0 {
			return malformed(op, "want %d integers, got %d values", len(v), len(arr))
		}
		return malformed(op, "want %d or %d integers, got %d values", short, len(v), len(arr))
	}
	clear(v[len(arr):])
	for i := range arr {
		if v[i], err = arr[i].ToInt64(); err != nil {
			return malformed(op, "value %d: %v", i, err)
		}
	}
	return nil
}

func isFlag(v int64) bool { return v == 0 || v == 1 }
