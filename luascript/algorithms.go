package luascript

import (
	_ "embed"
	"errors"
	"strconv"

	"quotad/limits"
)

// Bounds, as quotad/limits defines them; the scripts check them again.
const (
	MaxLimit          = limits.MaxLimit
	MaxWindowMS       = limits.MaxWindowMS
	MaxRequestIDLen   = limits.MaxRequestIDBytes
	MaxRequestIDsSize = limits.MaxRequestIDs // upper bound of Args.MaxRequestIDs
	// MaxLeases bounds a concurrency limit: every take reads the whole
	// lease set, so this bounds the work and memory of one decision.
	MaxLeases = limits.MaxLeases
)

var (
	//go:embed fixed_window_take.lua
	fixedWindowTakeBody string
	//go:embed fixed_window_peek.lua
	fixedWindowPeekBody string
	//go:embed fixed_window_settle.lua
	fixedWindowSettleBody string
	//go:embed token_bucket_take.lua
	tokenBucketTakeBody string
	//go:embed token_bucket_peek.lua
	tokenBucketPeekBody string
	//go:embed token_bucket_settle.lua
	tokenBucketSettleBody string
	//go:embed concurrency_take.lua
	concurrencyTakeBody string
	//go:embed concurrency_peek.lua
	concurrencyPeekBody string
	//go:embed concurrency_release.lua
	concurrencyReleaseBody string
	//go:embed sliding_window_take.lua
	slidingWindowTakeBody string
	//go:embed sliding_window_peek.lua
	slidingWindowPeekBody string
	//go:embed sliding_window_settle.lua
	slidingWindowSettleBody string
	//go:embed calendar_take.lua
	calendarTakeBody string
	//go:embed calendar_peek.lua
	calendarPeekBody string
	//go:embed calendar_settle.lua
	calendarSettleBody string

	fixedWindowTake     = newScript("fixed_window_take.lua", fixedWindowTakeBody, &fixedWindowTakeContract)
	fixedWindowPeek     = newScript("fixed_window_peek.lua", fixedWindowPeekBody, &fixedWindowPeekContract)
	fixedWindowSettle   = newScript("fixed_window_settle.lua", fixedWindowSettleBody, &fixedWindowSettleContract)
	tokenBucketTake     = newScript("token_bucket_take.lua", tokenBucketTakeBody, &tokenBucketTakeContract)
	tokenBucketPeek     = newScript("token_bucket_peek.lua", tokenBucketPeekBody, &tokenBucketPeekContract)
	tokenBucketSettle   = newScript("token_bucket_settle.lua", tokenBucketSettleBody, &tokenBucketSettleContract)
	concurrencyTake     = newScript("concurrency_take.lua", concurrencyTakeBody, &concurrencyTakeContract)
	concurrencyPeek     = newScript("concurrency_peek.lua", concurrencyPeekBody, &concurrencyPeekContract)
	concurrencyRelease  = newScript("concurrency_release.lua", concurrencyReleaseBody, &concurrencyReleaseContract)
	slidingWindowTake   = newScript("sliding_window_take.lua", slidingWindowTakeBody, &slidingWindowTakeContract)
	slidingWindowPeek   = newScript("sliding_window_peek.lua", slidingWindowPeekBody, &slidingWindowPeekContract)
	slidingWindowSettle = newScript("sliding_window_settle.lua", slidingWindowSettleBody, &slidingWindowSettleContract)
	calendarTake        = newScript("calendar_take.lua", calendarTakeBody, &calendarTakeContract)
	calendarPeek        = newScript("calendar_peek.lua", calendarPeekBody, &calendarPeekContract)
	calendarSettle      = newScript("calendar_settle.lua", calendarSettleBody, &calendarSettleContract)
)

// An algorithm's scripts, by op, and the check of its limits.
type algorithm struct {
	take, peek, settle *script
	limits             func(a *Args) error
}

// algorithms are the scripts of each algorithm, by its name in
// quotad/limits. A concurrency lease is not settled but released
// (ReleaseCall).
var algorithms = map[string]algorithm{
	limits.FixedWindow:   {fixedWindowTake, fixedWindowPeek, fixedWindowSettle, checkWindow},
	limits.SlidingWindow: {slidingWindowTake, slidingWindowPeek, slidingWindowSettle, checkWindow},
	limits.TokenBucket:   {tokenBucketTake, tokenBucketPeek, tokenBucketSettle, func(a *Args) error { return a.TokenBucket.Validate() }},
	limits.Concurrency:   {concurrencyTake, concurrencyPeek, nil, func(a *Args) error { return invalid(limits.CheckConcurrency(a.Limit, a.LeaseMS)) }},
	limits.Calendar:      {calendarTake, calendarPeek, calendarSettle, checkCalendar},
}

// Args are the arguments of a call of any algorithm and op: each script
// sends those its contract names (contract.go), and the others are not
// read. The caller validates; the builders check the bounds again, and so
// do the scripts.
type Args struct {
	// Key is the state's key: FixedWindowKey, ..., a calendar window's
	// CalendarKey (each period's window is CalendarPeriodKey of it).
	Key string
	// The limits. Limit: a window's or calendar window's limit, or the
	// leases a lease set holds at once (1..MaxLeases); WindowMS: a fixed
	// or sliding window's length; LeaseMS: how long a lease lives unless
	// renewed; TokenBucket: a bucket's shape; Spec and Periods: a calendar
	// window's limits (CalendarWindow.Spec) and its periods around the
	// caller's clock (CalendarAround).
	Limit    int64
	WindowMS int64
	LeaseMS  int64
	TokenBucket
	Spec    string
	Periods CalendarPeriods
	// Cost is a take's, 1..its limit or burst, or a settle's actual cost,
	// 0..MaxLimit (0 gives the whole take back).
	Cost int64
	// RequestID makes a take idempotent ("" for none; a lease's name,
	// required) and names the take a settle settles (required).
	RequestID string
	// Strict is for inline limits: a live key written under other limits
	// is ErrPolicy. A named policy's new limits apply at once.
	Strict bool
	// MaxRequestIDs caps the request ids a take's key records,
	// 1..MaxRequestIDsSize.
	MaxRequestIDs int64
	// DedupeMS is how long a token bucket remembers a request id,
	// 1..MaxWindowMS.
	DedupeMS int64
}

// TakeCall validates a take of algorithm (limits.FixedWindow, ...) and
// builds its script call, for Call.Exec or ExecBatch; ParseTake reads the
// result. A denial writes nothing; a take is never retried here, since a
// retry without a request id could take twice.
func TakeCall(algorithm string, a Args) (Call, error) { return build(algorithm, opTake, &a) }

// PeekCall validates a peek, which reads without writing anything, and
// builds its script call; ParsePeek reads the result.
func PeekCall(algorithm string, a Args) (Call, error) { return build(algorithm, opPeek, &a) }

// SettleCall validates a settle of an accepted take, named by a.Key and
// a.RequestID, and builds its script call; ParseSettle reads the result.
// A settle moves the state by a.Cost minus what the take reserved, either
// way, is never limited and never creates state: a take the state no
// longer holds (its window ended, it slid out, the bucket forgot it) or
// never held is settled as a no-op (Result.Settled false).
func SettleCall(algorithm string, a Args) (Call, error) { return build(algorithm, opSettle, &a) }

// ReleaseCall validates a release of the lease requestID of the lease set
// at key and builds its script call; ParseRelease reads the result.
func ReleaseCall(key, requestID string) (Call, error) {
	a := Args{Key: key, RequestID: requestID}
	if key == "" {
		return Call{}, errEmptyKey
	}
	if err := concurrencyRelease.c.check(&a); err != nil {
		return Call{}, err
	}
	return concurrencyRelease.call(&a), nil
}

type op int

const (
	opTake op = iota
	opPeek
	opSettle
)

func build(name string, o op, a *Args) (Call, error) {
	alg, ok := algorithms[name]
	if !ok {
		return Call{}, &Error{Code: CodeInvalid, Message: "no algorithm " + strconv.Quote(name)}
	}
	s := [...]*script{alg.take, alg.peek, alg.settle}[o]
	if s == nil {
		return Call{}, &Error{Code: CodeInvalid, Message: name + " has no settle"}
	}
	if a.Key == "" {
		return Call{}, errEmptyKey
	}
	if err := alg.limits(a); err != nil {
		return Call{}, err
	}
	if err := s.c.check(a); err != nil {
		return Call{}, err
	}
	return s.call(a), nil
}

// check refuses a's values of the contract's arguments that are not the
// limits: a cost, a cap, a horizon, a request id.
func (c *contract) check(a *Args) error {
	for _, x := range c.argv() {
		switch x.name {
		case "cost":
			lo, hi, of := int64(1), a.Limit, "the limit"
			switch x.hi {
			case "burst":
				hi, of = a.Burst, "the burst"
			case "MAX_LIMIT":
				lo, hi, of = 0, MaxLimit, strconv.FormatInt(MaxLimit, 10)
			}
			if a.Cost < lo || a.Cost > hi {
				return &Error{Code: CodeInvalid, Message: "cost must be an integer from " + strconv.FormatInt(lo, 10) + " to " + of}
			}
		case "maxids":
			if err := limits.CheckMaxRequestIDs(a.MaxRequestIDs); err != nil {
				return invalid(err)
			}
		case "dedupe":
			if err := limits.CheckDuration("dedupe_ms", a.DedupeMS); err != nil {
				return invalid(err)
			}
		case "id":
			if err := checkRequestID(a.RequestID, x.kind == argIDRequired); err != nil {
				return err
			}
		}
	}
	return nil
}

// encoders write each argument of a contract from Args, by its name.
var encoders = map[string]func(a *Args) string{
	"limit":  func(a *Args) string { return decimal(a.Limit) },
	"window": func(a *Args) string { return decimal(a.WindowMS) },
	"lease":  func(a *Args) string { return decimal(a.LeaseMS) },
	"rate":   func(a *Args) string { return decimal(a.Rate) },
	"period": func(a *Args) string { return decimal(a.PeriodMS) },
	"burst":  func(a *Args) string { return decimal(a.Burst) },
	// A cost varies from call to call: formatted each time.
	"cost":   func(a *Args) string { return strconv.FormatInt(a.Cost, 10) },
	"maxids": func(a *Args) string { return decimal(a.MaxRequestIDs) },
	"dedupe": func(a *Args) string { return decimal(a.DedupeMS) },
	"strict": func(a *Args) string { return flag(a.Strict) },
	"id":     func(a *Args) string { return a.RequestID },
	"spec":   func(a *Args) string { return a.Spec },
	"e1":     func(a *Args) string { return strconv.FormatInt(a.Periods.Edges[0], 10) },
	"e2":     func(a *Args) string { return strconv.FormatInt(a.Periods.Edges[1], 10) },
	"e3":     func(a *Args) string { return strconv.FormatInt(a.Periods.Edges[2], 10) },
	"e4":     func(a *Args) string { return strconv.FormatInt(a.Periods.Edges[3], 10) },
}

// encoding is how a contract's ARGV is written from Args, in order; a
// name without an encoder is a fault of the package's own contracts,
// which every test finds at init.
func (c *contract) encoding() []func(*Args) string {
	var enc []func(*Args) string
	for _, x := range c.argv() {
		e, ok := encoders[x.name]
		if !ok {
			panic("luascript: no encoder for the argument " + x.name)
		}
		enc = append(enc, e)
	}
	return enc
}

// call is the call of s with a's keys and arguments, all in one
// allocation: a.Key, or a calendar's three period keys.
func (s *script) call(a *Args) Call {
	nk := s.c.keys
	kv := make([]string, nk+len(s.enc))
	if nk == 1 {
		kv[0] = a.Key
	} else {
		for i, st := range a.Periods.Starts {
			kv[i] = CalendarPeriodKey(a.Key, st)
		}
	}
	for i, e := range s.enc {
		kv[nk+i] = e(a)
	}
	return Call{s: s, keys: kv[:nk:nk], args: kv[nk:]}
}

func checkWindow(a *Args) error {
	return invalid(limits.CheckFixedWindow(a.Limit, a.WindowMS))
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

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

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

// Validate checks the bounds the scripts check (limits.CheckTokenBucket).
// The refill time is bounded by MaxWindowMS, so every time a bucket stores
// fits a key's TTL.
func (b TokenBucket) Validate() error {
	return invalid(limits.CheckTokenBucket(b.Rate, b.PeriodMS, b.Burst))
}

// SlidingWindowKey is the key of the sliding window that (policy, subject)
// counts against, laid out as FixedWindowKey.
func SlidingWindowKey(prefix, policy, subject string) string {
	return layoutKey(prefix, "sw", policy, subject)
}
