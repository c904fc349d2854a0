package luascript

import (
	"context"
	"strconv"

	"github.com/redis/rueidis"
)

// Allotments (docs/allotments.md): a sidecar reserves units of a key's
// quota in one atomic take (ReserveCall), hands them out from memory, and
// gives back what it did not use (ReturnCall) to the window it took them
// in. A reservation is recorded in the key's hash under its holder,
// a:<holder> "<seq>:<units reserved in this window>", so that a return
// names it by (holder, seq) and is applied once however often it is sent.

// Reservation is a reservation's answer (ParseReserve).
type Reservation struct {
	// Granted is the units taken, Cost..Want; 0 when the take's cost does
	// not fit, a denial told to retry after RetryAfterMS.
	Granted int64
	// Used, Remaining and ResetMS are the state's right after the
	// reservation, as a take's (Result).
	Used, Remaining, ResetMS, RetryAfterMS int64
	// ValidMS is how long the granted units may be handed out: until the
	// window or period they count in ends.
	ValidMS int64
	// Period is which of a calendar take's three periods the units count
	// in (1..3), 0 for the other algorithms.
	Period int
	Healed bool
}

// HasAllotments reports whether algorithm can reserve.
func HasAllotments(algorithm string) bool { return algorithms[algorithm].reserve != nil }

// ReserveCall validates a reservation of algorithm and builds its call:
// a take's arguments (without a request id or a strict flag: only a named
// policy has an allotment), Want, SharePPM, and the holder (RequestID)
// with its Seq. ParseReserve reads its reply. Like a take it is never
// retried.
func ReserveCall(algorithm string, a Args) (Call, error) {
	alg, ok := algorithms[algorithm]
	if !ok || alg.reserve == nil {
		return Call{}, &Error{Code: CodeInvalid, Message: "no allotments for " + strconv.Quote(algorithm)}
	}
	if a.Key == "" {
		return Call{}, errEmptyKey
	}
	if err := a.checkLimits(alg.limits); err != nil {
		return Call{}, err
	}
	if err := alg.reserve.check(&a); err != nil {
		return Call{}, err
	}
	return alg.reserve.call(&a), nil
}

// ReturnCall validates the return of a.Cost units (0..MaxLimit) of the
// reservation (a.RequestID, a.Seq) of algorithm, to the state at a.Key:
// for a calendar window the period key the reservation counted in
// (CalendarPeriodKey). A bucket's and a sliding window's return need
// their limits too. It is safe to send again after a lost reply.
func ReturnCall(algorithm string, a Args) (Call, error) {
	alg, ok := algorithms[algorithm]
	if !ok || alg.ret == nil {
		return Call{}, &Error{Code: CodeInvalid, Message: "no allotments for " + strconv.Quote(algorithm)}
	}
	if a.Key == "" {
		return Call{}, errEmptyKey
	}
	if alg.ret.c.index("rate") > 0 || alg.ret.c.index("window") > 0 {
		if err := a.checkLimits(alg.limits); err != nil {
			return Call{}, err
		}
	}
	if err := alg.ret.check(&a); err != nil {
		return Call{}, err
	}
	return alg.ret.call(&a), nil
}

// ParseReserve reads a reservation's reply: {granted, used, remaining,
// reset_ms, retry_after_ms, valid_ms, healed, period}. A refusal is an
// *Error and nothing was reserved.
func ParseReserve(res rueidis.RedisResult) (Reservation, error) {
	const op = "reserve"
	if err := res.Error(); err != nil {
		return Reservation{}, replyError(op, err)
	}
	var v [8]int64
	if err := ints(op, res, v[:], 0); err != nil {
		return Reservation{}, err
	}
	granted, used, remaining, reset, retry, valid, healed, period := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
	if granted < 0 || granted > MaxLimit || !level(used, remaining) || reset < 0 || retry < 0 || valid < 0 ||
		!isFlag(healed) || period < 0 || period > 3 || granted > 0 && retry != 0 || granted == 0 && valid != 0 {
		return Reservation{}, malformed(op, "reply %v", v)
	}
	return Reservation{
		Granted: granted, Used: used, Remaining: remaining, ResetMS: reset, RetryAfterMS: retry,
		ValidMS: valid, Period: int(period), Healed: healed == 1,
	}, nil
}

// ParseReturn reads a return's reply: {returned, used}; returned is 0
// when nothing was applied (the window ended, or the return was applied
// before).
func ParseReturn(res rueidis.RedisResult) (returned int64, err error) {
	const op = "return"
	if err := res.Error(); err != nil {
		return 0, replyError(op, err)
	}
	var v [2]int64
	if err := ints(op, res, v[:], 0); err != nil {
		return 0, err
	}
	if v[0] < 0 || v[0] > MaxLimit || v[1] < 0 {
		return 0, malformed(op, "reply %v", v)
	}
	return v[0], nil
}

// Reserve makes one reservation: ReserveCall, Exec and ParseReserve.
func Reserve(ctx context.Context, c rueidis.Client, algorithm string, a Args) (Reservation, error) {
	call, err := ReserveCall(algorithm, a)
	if err != nil {
		return Reservation{}, err
	}
	return ParseReserve(call.Exec(ctx, c))
}

// Return gives back a.Cost units of a reservation: ReturnCall, Exec and
// ParseReturn.
func Return(ctx context.Context, c rueidis.Client, algorithm string, a Args) (int64, error) {
	call, err := ReturnCall(algorithm, a)
	if err != nil {
		return 0, err
	}
	return ParseReturn(call.Exec(ctx, c))
}
