package luascript

import (
	"context"
	_ "embed"
	"errors"
	"strconv"

	"github.com/redis/rueidis"

	"quotad/limits"
)

// Bounds, as quotad/limits defines them; the scripts check them again.
const (
	MaxLimit          = limits.MaxLimit
	MaxWindowMS       = limits.MaxWindowMS
	MaxRequestIDLen   = limits.MaxRequestIDBytes
	MaxRequestIDsSize = limits.MaxRequestIDs // upper bound of TakeArgs.MaxRequestIDs
)

var (
	//go:embed fixed_window_take.lua
	fixedWindowTakeBody string
	//go:embed fixed_window_peek.lua
	fixedWindowPeekBody string

	fixedWindowTake = newScript("fixed_window_take.lua", fixedWindowTakeBody)
	fixedWindowPeek = newScript("fixed_window_peek.lua", fixedWindowPeekBody)
)

// TakeArgs is one quota decision. The caller validates; the bounds are
// checked again here and in the script.
type TakeArgs struct {
	Key      string
	Limit    int64 // 1..MaxLimit
	WindowMS int64 // 1..MaxWindowMS
	Cost     int64 // 1..Limit
	// RequestID makes the take idempotent within its window: "" for none,
	// else 1..MaxRequestIDLen of [A-Za-z0-9_-].
	RequestID string
	// Strict is for inline limits: a live window opened with another limit
	// or window is ErrPolicy. Named policies are not strict, so an
	// operator's change applies to live windows at once.
	Strict bool
	// MaxRequestIDs caps the request ids recorded per window,
	// 1..MaxRequestIDsSize.
	MaxRequestIDs int64
}

// TakeResult is the decision.
type TakeResult struct {
	Allowed bool
	// Replay: RequestID was already accepted in this window with the same
	// cost; nothing was consumed.
	Replay bool
	// Used after this decision; for a replay, Used right after the original
	// acceptance.
	Used int64
	// ResetMS is Redis's PTTL of the window after the decision, in ms; 0 if
	// there is no window.
	ResetMS int64
	// Healed: the window had no TTL and was given WindowMS.
	Healed bool
}

// FixedWindowTake makes one atomic decision on the window at a.Key. The
// window opens at its first accepted take and lasts a.WindowMS; nothing
// extends it. A denial writes nothing.
//
// An *Error means the decision was not applied. Any other error leaves the
// outcome unknown; FixedWindowTake never retries, since a retry without a
// request id could take twice.
func FixedWindowTake(ctx context.Context, c rueidis.Client, a TakeArgs) (TakeResult, error) {
	call, err := TakeCall(a)
	if err != nil {
		return TakeResult{}, err
	}
	return ParseTake(call.Exec(ctx, c))
}

// TakeCall validates a take and builds its script call, for Call.Exec or
// ExecMulti; ParseTake reads the result.
func TakeCall(a TakeArgs) (Call, error) {
	if err := validateTake(a); err != nil {
		return Call{}, err
	}
	return oneKey(fixedWindowTake, a.Key,
		decimal(a.Limit),
		decimal(a.WindowMS),
		strconv.FormatInt(a.Cost, 10),
		decimal(a.MaxRequestIDs),
		flag(a.Strict),
		a.RequestID,
	), nil
}

// ParseTake reads the result of a take's call. Its errors are
// FixedWindowTake's.
func ParseTake(res rueidis.RedisResult) (TakeResult, error) {
	const op = "fixed window take"
	if err := res.Error(); err != nil {
		return TakeResult{}, replyError(op, err)
	}
	var v [5]int64
	if err := ints(op, res, v[:]); err != nil {
		return TakeResult{}, err
	}
	allowed, used, replay, pttl, healed := v[0], v[1], v[2], v[3], v[4]
	if !isFlag(allowed) || !isFlag(replay) || !isFlag(healed) || replay > allowed || used < 0 || pttl < 0 {
		return TakeResult{}, malformed(op, "reply %v", v)
	}
	return TakeResult{
		Allowed: allowed == 1,
		Replay:  replay == 1,
		Used:    used,
		ResetMS: pttl,
		Healed:  healed == 1,
	}, nil
}

// PeekArgs names a window to read. Limit and WindowMS only matter when
// Strict, but are validated always.
type PeekArgs struct {
	Key      string
	Limit    int64
	WindowMS int64
	Strict   bool
}

// PeekResult is a window's state.
type PeekResult struct {
	Used int64
	// ResetMS is the window's PTTL in ms: 0 if there is no window, -1 if it
	// has no TTL (the next take restores one; peek never writes).
	ResetMS int64
	Exists  bool
}

// FixedWindowPeek reads the window at a.Key without writing anything.
func FixedWindowPeek(ctx context.Context, c rueidis.Client, a PeekArgs) (PeekResult, error) {
	call, err := PeekCall(a)
	if err != nil {
		return PeekResult{}, err
	}
	return ParsePeek(call.Exec(ctx, c))
}

// PeekCall validates a peek and builds its script call; ParsePeek reads the
// result.
func PeekCall(a PeekArgs) (Call, error) {
	if err := validatePeek(a); err != nil {
		return Call{}, err
	}
	return oneKey(fixedWindowPeek, a.Key,
		decimal(a.Limit),
		decimal(a.WindowMS),
		flag(a.Strict),
	), nil
}

// ParsePeek reads the result of a peek's call. Its errors are
// FixedWindowPeek's.
func ParsePeek(res rueidis.RedisResult) (PeekResult, error) {
	const op = "fixed window peek"
	if err := res.Error(); err != nil {
		return PeekResult{}, replyError(op, err)
	}
	var v [3]int64
	if err := ints(op, res, v[:]); err != nil {
		return PeekResult{}, err
	}
	exists, used, pttl := v[0], v[1], v[2]
	if !isFlag(exists) || used < 0 || pttl < -1 || (exists == 0 && (used != 0 || pttl != 0)) {
		return PeekResult{}, malformed(op, "reply %v", v)
	}
	return PeekResult{Used: used, ResetMS: pttl, Exists: exists == 1}, nil
}

func validateTake(a TakeArgs) error {
	if err := validateWindow(a.Key, a.Limit, a.WindowMS); err != nil {
		return err
	}
	if a.Cost < 1 || a.Cost > a.Limit {
		return &Error{Code: CodeInvalid, Message: "cost must be an integer from 1 to the limit"}
	}
	if err := limits.ValidateMaxRequestIDs(a.MaxRequestIDs); err != nil {
		return invalid(err)
	}
	return checkRequestID(a.RequestID, false)
}

func validatePeek(a PeekArgs) error {
	return validateWindow(a.Key, a.Limit, a.WindowMS)
}

func validateWindow(key string, limit, windowMS int64) error {
	if key == "" {
		return errEmptyKey
	}
	return invalid(limits.ValidateFixedWindow(limit, windowMS))
}

var errEmptyKey = &Error{Code: CodeInvalid, Message: "key must not be empty"}

// invalid turns a bound that quotad/limits refused into CodeInvalid; nil
// stays nil.
func invalid(err error) error {
	if err == nil {
		return nil
	}
	var le *limits.Error
	if errors.As(err, &le) {
		return &Error{Code: CodeInvalid, Message: le.Message}
	}
	return &Error{Code: CodeInvalid, Message: err.Error()}
}

// checkRequestID checks a request id, as the scripts do; "" means none,
// which only a take that may go without one accepts.
func checkRequestID(id string, required bool) error {
	switch {
	case id == "" && !required, limits.ValidRequestID(id):
		return nil
	case id == "":
		return &Error{Code: CodeInvalid, Message: "request_id is required"}
	}
	return &Error{Code: CodeInvalid, Message: limits.RequestIDRule}
}

// ints reads a reply that must be an array of exactly len(v) integers
// into v, which the caller keeps on its stack.
func ints(op string, res rueidis.RedisResult, v []int64) error {
	arr, err := res.ToArray()
	if err != nil {
		return malformed(op, "%v", err)
	}
	if len(arr) != len(v) {
		return malformed(op, "want %d integers, got %d values", len(v), len(arr))
	}
	for i := range arr {
		if v[i], err = arr[i].ToInt64(); err != nil {
			return malformed(op, "value %d: %v", i, err)
		}
	}
	return nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func isFlag(v int64) bool { return v == 0 || v == 1 }
