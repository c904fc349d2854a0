package luascript

import (
	_ "embed"
	"strconv"

	"github.com/redis/rueidis"

	"quotad/limits"
)

var (
	//go:embed fixed_window_settle.lua
	fixedWindowSettleBody string
	//go:embed sliding_window_settle.lua
	slidingWindowSettleBody string
	//go:embed calendar_settle.lua
	calendarSettleBody string
	//go:embed token_bucket_settle.lua
	tokenBucketSettleBody string

	fixedWindowSettle   = newScript("fixed_window_settle.lua", fixedWindowSettleBody)
	slidingWindowSettle = newScript("sliding_window_settle.lua", slidingWindowSettleBody)
	calendarSettle      = newScript("calendar_settle.lua", calendarSettleBody)
	tokenBucketSettle   = newScript("token_bucket_settle.lua", tokenBucketSettleBody)
)

// A settle names an accepted take by its key and request id and gives its
// actual cost: the state moves by the cost minus what the take reserved,
// either way, and a settlement records the cost, so that the same settle
// again is a replay and one of another cost a CONFLICT. A settle is never
// limited and never creates state: a take the state no longer holds (its
// window ended, it slid out, the bucket forgot it) or never held is
// settled as a no-op (SettleResult.Settled false).

// WindowSettleArgs settles a take of a fixed or sliding window.
type WindowSettleArgs struct {
	Key      string
	Limit    int64 // 1..MaxLimit
	WindowMS int64 // 1..MaxWindowMS
	// Cost is the take's actual cost, 0..MaxLimit: 0 gives the whole take
	// back.
	Cost      int64
	RequestID string // the take's, required
	// Strict is for inline limits: a live window of other limits is
	// ErrPolicy.
	Strict bool
}

// CalendarSettleArgs settles a take of a calendar window in the period
// holding Redis's clock.
type CalendarSettleArgs struct {
	Key       string // the subject's CalendarKey
	Spec      string
	Limit     int64
	Periods   CalendarPeriods
	Cost      int64 // 0..MaxLimit
	RequestID string
	Strict    bool
}

// TokenBucketSettleArgs settles a take of a token bucket.
type TokenBucketSettleArgs struct {
	Key string
	TokenBucket
	Cost      int64 // 0..MaxLimit
	RequestID string
	DedupeMS  int64 // 1..MaxWindowMS, as the takes of the bucket
	Strict    bool
}

// SettleResult is a settle's answer, for every algorithm.
type SettleResult struct {
	// Settled: the state holds the take and the settlement applies to it
	// (now, or before for a replay). False: nothing to settle, nothing
	// changed.
	Settled bool
	// Replay: settled before with the same cost; nothing changed now.
	Replay bool
	// Reserved is the cost the take reserved; 0 when not Settled.
	Reserved int64
	// Used is a window's use after the settle (for a sliding window, the
	// estimate, rounded up); Remaining is a token bucket's whole tokens.
	// Each is 0 for the other algorithms.
	Used      int64
	Remaining int64
	// ResetMS and RetryAfterMS are what a take of 1 would be told now.
	ResetMS      int64
	RetryAfterMS int64
	// Healed: the key had no TTL and was given one.
	Healed bool
}

func validateSettle(key string, cost int64, requestID string) error {
	if key == "" {
		return errEmptyKey
	}
	if cost < 0 || cost > MaxLimit {
		return &Error{Code: CodeInvalid, Message: "cost must be an integer from 0 to " + strconv.FormatInt(MaxLimit, 10)}
	}
	return checkRequestID(requestID, true)
}

// FixedWindowSettleCall validates a fixed window settle and builds its
// script call; ParseFixedWindowSettle reads the result.
func FixedWindowSettleCall(a WindowSettleArgs) (Call, error) {
	return windowSettleCall(fixedWindowSettle, a)
}

// SlidingWindowSettleCall validates a sliding window settle and builds its
// script call; ParseSlidingWindowSettle reads the result.
func SlidingWindowSettleCall(a WindowSettleArgs) (Call, error) {
	return windowSettleCall(slidingWindowSettle, a)
}

func windowSettleCall(s *script, a WindowSettleArgs) (Call, error) {
	if err := validateWindow(a.Key, a.Limit, a.WindowMS); err != nil {
		return Call{}, err
	}
	if err := validateSettle(a.Key, a.Cost, a.RequestID); err != nil {
		return Call{}, err
	}
	return oneKey(s, a.Key,
		decimal(a.Limit),
		decimal(a.WindowMS),
		strconv.FormatInt(a.Cost, 10),
		flag(a.Strict),
		a.RequestID,
	), nil
}

// CalendarSettleCall validates a calendar settle and builds its script
// call; ParseCalendarSettle reads the result.
func CalendarSettleCall(a CalendarSettleArgs) (Call, error) {
	if err := validateCalendar(a.Key, a.Limit, a.Spec, a.Periods); err != nil {
		return Call{}, err
	}
	if err := validateSettle(a.Key, a.Cost, a.RequestID); err != nil {
		return Call{}, err
	}
	args := CalendarArgs{Key: a.Key, Periods: a.Periods}
	return Call{s: calendarSettle, keys: args.keys(), args: append([]string{
		decimal(a.Limit),
		strconv.FormatInt(a.Cost, 10),
		flag(a.Strict),
		a.RequestID,
		a.Spec,
	}, edgeArgs(a.Periods)...)}, nil
}

// TokenBucketSettleCall validates a token bucket settle and builds its
// script call; ParseTokenBucketSettle reads the result.
func TokenBucketSettleCall(a TokenBucketSettleArgs) (Call, error) {
	if a.Key == "" {
		return Call{}, errEmptyKey
	}
	if err := a.Validate(); err != nil {
		return Call{}, err
	}
	if err := limits.ValidateDuration("dedupe_ms", a.DedupeMS); err != nil {
		return Call{}, invalid(err)
	}
	if err := validateSettle(a.Key, a.Cost, a.RequestID); err != nil {
		return Call{}, err
	}
	return oneKey(tokenBucketSettle, a.Key, decimal(a.Rate), decimal(a.PeriodMS), decimal(a.Burst),
		strconv.FormatInt(a.Cost, 10),
		decimal(a.DedupeMS),
		flag(a.Strict),
		a.RequestID,
	), nil
}

// ParseFixedWindowSettle reads the result of a fixed window settle's call.
func ParseFixedWindowSettle(res rueidis.RedisResult) (SettleResult, error) {
	return parseSettle("fixed window settle", res, MaxLimit, false)
}

// ParseSlidingWindowSettle reads the result of a sliding window settle's
// call.
func ParseSlidingWindowSettle(res rueidis.RedisResult) (SettleResult, error) {
	return parseSettle("sliding window settle", res, 2*MaxLimit, false)
}

// ParseCalendarSettle reads the result of a calendar settle's call.
func ParseCalendarSettle(res rueidis.RedisResult) (SettleResult, error) {
	r, err := parseSettle("calendar settle", res, MaxLimit, false)
	if err == nil && (r.ResetMS < 1 || r.ResetMS > maxPeriodMS) {
		return SettleResult{}, malformed("calendar settle", "reset_ms %d", r.ResetMS)
	}
	return r, err
}

// ParseTokenBucketSettle reads the result of a token bucket settle's call.
func ParseTokenBucketSettle(res rueidis.RedisResult) (SettleResult, error) {
	return parseSettle("token bucket settle", res, MaxLimit, true)
}

// parseSettle reads {settled, replay, reserved, level, reset_ms,
// retry_after_ms, healed}: level is used, at most maxLevel, or a bucket's
// remaining tokens.
func parseSettle(op string, res rueidis.RedisResult, maxLevel int64, bucket bool) (SettleResult, error) {
	if err := res.Error(); err != nil {
		return SettleResult{}, replyError(op, err)
	}
	var v [7]int64
	if err := ints(op, res, v[:]); err != nil {
		return SettleResult{}, err
	}
	settled, replay, reserved, level, reset, retry, healed := v[0], v[1], v[2], v[3], v[4], v[5], v[6]
	if !isFlag(settled) || !isFlag(replay) || !isFlag(healed) || replay > settled ||
		(settled == 1) != (reserved > 0) || reserved > MaxLimit || level < 0 || level > maxLevel ||
		reset < 0 || retry < 0 {
		return SettleResult{}, malformed(op, "reply %v", v)
	}
	r := SettleResult{
		Settled: settled == 1, Replay: replay == 1, Reserved: reserved,
		ResetMS: reset, RetryAfterMS: retry, Healed: healed == 1,
	}
	if bucket {
		r.Remaining = level
	} else {
		r.Used = level
	}
	return r, nil
}
