package luascript

import (
	"context"
	_ "embed"
	"strconv"

	"github.com/redis/rueidis"
)

// Bounds shared with the scripts, which check them again.
const (
	MaxLimit          = 1_000_000_000
	MaxWindowMS       = 2_678_400_000 // 31 days
	MaxRequestIDLen   = 64
	MaxRequestIDsSize = 1_000_000 // upper bound of TakeArgs.MaxRequestIDs
)

var (
	//go:embed fixed_window_take.lua
	fixedWindowTakeSrc string
	//go:embed fixed_window_peek.lua
	fixedWindowPeekSrc string

	// Not the retryable variants: a take whose reply was lost may have been
	// applied, and only the caller's request id makes a second attempt safe.
	// EVALSHA falls back to EVAL on NOSCRIPT, which means it did not run.
	fixedWindowTake = rueidis.NewLuaScript(fixedWindowTakeSrc)
	fixedWindowPeek = newReadOnlyScript(fixedWindowPeekSrc)
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
	return Call{LuaExec: rueidis.LuaExec{
		Keys: []string{a.Key},
		Args: []string{
			strconv.FormatInt(a.Limit, 10),
			strconv.FormatInt(a.WindowMS, 10),
			strconv.FormatInt(a.Cost, 10),
			strconv.FormatInt(a.MaxRequestIDs, 10),
			flag(a.Strict),
			a.RequestID,
		},
	}}, nil
}

// ParseTake reads the result of a take's call. Its errors are
// FixedWindowTake's.
func ParseTake(res rueidis.RedisResult) (TakeResult, error) {
	const op = "fixed window take"
	if err := res.Error(); err != nil {
		return TakeResult{}, replyError(op, err)
	}
	v, err := ints(op, res, 5)
	if err != nil {
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
	return Call{peek: true, LuaExec: rueidis.LuaExec{
		Keys: []string{a.Key},
		Args: []string{
			strconv.FormatInt(a.Limit, 10),
			strconv.FormatInt(a.WindowMS, 10),
			flag(a.Strict),
		},
	}}, nil
}

// ParsePeek reads the result of a peek's call. Its errors are
// FixedWindowPeek's.
func ParsePeek(res rueidis.RedisResult) (PeekResult, error) {
	const op = "fixed window peek"
	if err := res.Error(); err != nil {
		return PeekResult{}, replyError(op, err)
	}
	v, err := ints(op, res, 3)
	if err != nil {
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
	switch {
	case a.Cost < 1 || a.Cost > a.Limit:
		return &Error{Code: CodeInvalid, Message: "cost must be a decimal in 1..limit"}
	case a.MaxRequestIDs < 1 || a.MaxRequestIDs > MaxRequestIDsSize:
		return &Error{Code: CodeInvalid, Message: "max request ids must be a decimal in 1..1000000"}
	case !validRequestID(a.RequestID):
		return &Error{Code: CodeInvalid, Message: "request id must be 1..64 of A-Z a-z 0-9 _ -"}
	}
	return nil
}

func validatePeek(a PeekArgs) error {
	return validateWindow(a.Key, a.Limit, a.WindowMS)
}

func validateWindow(key string, limit, windowMS int64) error {
	switch {
	case key == "":
		return &Error{Code: CodeInvalid, Message: "key must not be empty"}
	case limit < 1 || limit > MaxLimit:
		return &Error{Code: CodeInvalid, Message: "limit must be a decimal in 1..1000000000"}
	case windowMS < 1 || windowMS > MaxWindowMS:
		return &Error{Code: CodeInvalid, Message: "window_ms must be a decimal in 1..2678400000"}
	}
	return nil
}

// validRequestID mirrors the script's ^[A-Za-z0-9_-]+$ with at most
// MaxRequestIDLen bytes; "" means no request id.
func validRequestID(id string) bool {
	if len(id) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch b := id[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

// ints reads a reply that must be an array of exactly n integers.
func ints(op string, res rueidis.RedisResult, n int) ([]int64, error) {
	arr, err := res.ToArray()
	if err != nil {
		return nil, malformed(op, "%v", err)
	}
	if len(arr) != n {
		return nil, malformed(op, "want %d integers, got %d values", n, len(arr))
	}
	v := make([]int64, n)
	for i := range arr {
		if v[i], err = arr[i].ToInt64(); err != nil {
			return nil, malformed(op, "value %d: %v", i, err)
		}
	}
	return v, nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func isFlag(v int64) bool { return v == 0 || v == 1 }
