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
	//go:embed calendar_give.lua
	calendarGiveBody string
	//go:embed calendar_settle.lua
	calendarSettleBody string
	//go:embed fixed_window_reserve.lua
	fixedWindowReserveBody string
	//go:embed calendar_reserve.lua
	calendarReserveBody string
	//go:embed window_return.lua
	windowReturnBody string
	//go:embed sliding_window_reserve.lua
	slidingWindowReserveBody string
	//go:embed sliding_window_return.lua
	slidingWindowReturnBody string
	//go:embed token_bucket_reserve.lua
	tokenBucketReserveBody string
	//go:embed token_bucket_return.lua
	tokenBucketReturnBody string

	fixedWindowTake      = newScript("fixed_window_take.lua", fixedWindowTakeBody, &fixedWindowTakeContract)
	fixedWindowPeek      = newScript("fixed_window_peek.lua", fixedWindowPeekBody, &fixedWindowPeekContract)
	fixedWindowSettle    = newScript("fixed_window_settle.lua", fixedWindowSettleBody, &fixedWindowSettleContract)
	tokenBucketTake      = newScript("token_bucket_take.lua", tokenBucketTakeBody, &tokenBucketTakeContract)
	tokenBucketPeek      = newScript("token_bucket_peek.lua", tokenBucketPeekBody, &tokenBucketPeekContract)
	tokenBucketSettle    = newScript("token_bucket_settle.lua", tokenBucketSettleBody, &tokenBucketSettleContract)
	concurrencyTake      = newScript("concurrency_take.lua", concurrencyTakeBody, &concurrencyTakeContract)
	concurrencyPeek      = newScript("concurrency_peek.lua", concurrencyPeekBody, &concurrencyPeekContract)
	concurrencyRelease   = newScript("concurrency_release.lua", concurrencyReleaseBody, &concurrencyReleaseContract)
	slidingWindowTake    = newScript("sliding_window_take.lua", slidingWindowTakeBody, &slidingWindowTakeContract)
	slidingWindowPeek    = newScript("sliding_window_peek.lua", slidingWindowPeekBody, &slidingWindowPeekContract)
	slidingWindowSettle  = newScript("sliding_window_settle.lua", slidingWindowSettleBody, &slidingWindowSettleContract)
	calendarTake         = newScript("calendar_take.lua", calendarTakeBody, &calendarTakeContract)
	calendarPeek         = newScript("calendar_peek.lua", calendarPeekBody, &calendarPeekContract)
	calendarSettle       = newScript("calendar_settle.lua", calendarSettleBody, &calendarSettleContract)
	calendarGive         = newScript("calendar_give.lua", calendarGiveBody, &calendarGiveContract)
	fixedWindowReserve   = newScript("fixed_window_reserve.lua", fixedWindowReserveBody, &fixedWindowReserveContract)
	calendarReserve      = newScript("calendar_reserve.lua", calendarReserveBody, &calendarReserveContract)
	windowReturn         = newScript("window_return.lua", windowReturnBody, &windowReturnContract)
	slidingWindowReserve = newScript("sliding_window_reserve.lua", slidingWindowReserveBody, &slidingWindowReserveContract)
	slidingWindowReturn  = newScript("sliding_window_return.lua", slidingWindowReturnBody, &slidingWindowReturnContract)
	tokenBucketReserve   = newScript("token_bucket_reserve.lua", tokenBucketReserveBody, &tokenBucketReserveContract)
	tokenBucketReturn    = newScript("token_bucket_return.lua", tokenBucketReturnBody, &tokenBucketReturnContract)
)

// An algorithm's scripts, by op, and the kind of its limits.
type algorithm struct {
	take, peek, settle *script
	limits             limitsKind
	// reserve and ret are an allotment's reservation and its return
	// (allotment.go), nil for an algorithm without allotments.
	reserve, ret *script
}

type limitsKind int

const (
	windowLimits limitsKind = iota
	bucketLimits
	leaseLimits
	calendarLimits
)

// checkLimits checks a's limits of that kind, as the scripts do. A switch,
// not a func value, so that a does not escape: a call of a builder
// allocates its Call alone.
func (a *Args) checkLimits(k limitsKind) error {
	switch k {
	case windowLimits:
		return invalid(limits.ValidateFixedWindow(a.Limit, a.WindowMS))
	case bucketLimits:
		return a.TokenBucket.Validate()
	case leaseLimits:
		return invalid(limits.ValidateConcurrency(a.Limit, a.LeaseMS))
	}
	return checkCalendar(a)
}

// algorithms are the scripts of each algorithm, by its name in
// quotad/limits. A concurrency lease is not settled but released
// (ReleaseCall).
var algorithms = map[string]algorithm{
	limits.FixedWindow:   {fixedWindowTake, fixedWindowPeek, fixedWindowSettle, windowLimits, fixedWindowReserve, windowReturn},
	limits.SlidingWindow: {slidingWindowTake, slidingWindowPeek, slidingWindowSettle, windowLimits, slidingWindowReserve, slidingWindowReturn},
	limits.TokenBucket:   {tokenBucketTake, tokenBucketPeek, tokenBucketSettle, bucketLimits, tokenBucketReserve, tokenBucketReturn},
	limits.Concurrency:   {concurrencyTake, concurrencyPeek, nil, leaseLimits, nil, nil},
	limits.Calendar:      {calendarTake, calendarPeek, calendarSettle, calendarLimits, calendarReserve, windowReturn},
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
	// A reservation's (ReserveCall): Want is the most units it takes
	// (Cost..the limit or burst), SharePPM the largest share of what is
	// left it may take, in parts per million; Seq numbers a holder's
	// reservations (1..2^53-1), and with RequestID, the holder, names the
	// reservation a return (ReturnCall) gives back to.
	// Kept is the units the holder still holds of its earlier
	// reservations of the key, which the record keeps for the return.
	Want     int64
	SharePPM int64
	Seq      int64
	Kept     int64
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
	if err := concurrencyRelease.check(&a); err != nil {
		return Call{}, err
	}
	return concurrencyRelease.call(&a), nil
}

// CalendarGiveCall validates a give back of a.Cost (1..MaxLimit) to the
// calendar window a.Key, a.Spec and a.Periods name, in the period holding
// Redis's clock, and builds its script call: its use falls by the cost,
// never below zero (calendar_give.lua). ParsePeek reads the result, the
// window after. It names no take: a give back sent twice gives back twice.
func CalendarGiveCall(a Args) (Call, error) {
	if a.Key == "" {
		return Call{}, errEmptyKey
	}
	if err := checkCalendar(&a); err != nil {
		return Call{}, err
	}
	if err := calendarGive.check(&a); err != nil {
		return Call{}, err
	}
	return calendarGive.call(&a), nil
}

// Settles reports whether algorithm has a settle script: a concurrency
// lease is released instead.
func Settles(algorithm string) bool { return algorithms[algorithm].settle != nil }

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
	if err := a.checkLimits(alg.limits); err != nil {
		return Call{}, err
	}
	if err := s.check(a); err != nil {
		return Call{}, err
	}
	return s.call(a), nil
}

// check refuses a's values of s's arguments that are not the limits: a
// cost, a cap, a horizon, a request id.
func (s *script) check(a *Args) error {
	for i, f := range s.fields {
		switch f {
		case fieldCost:
			lo, hi, of := int64(1), a.Limit, "the limit"
			switch s.argv[i].hi {
			case "burst":
				hi, of = a.Burst, "the burst"
			case "MAX_LIMIT":
				// A settle's actual cost may be 0; a give back's may not.
				lo, hi, of = 0, MaxLimit, strconv.FormatInt(MaxLimit, 10)
				if s.argv[i].lo == "1" {
					lo = 1
				}
			}
			if a.Cost < lo || a.Cost > hi {
				return &Error{Code: CodeInvalid, Message: "cost must be an integer from " + strconv.FormatInt(lo, 10) + " to " + of}
			}
		case fieldMaxIDs:
			if err := limits.ValidateMaxRequestIDs(a.MaxRequestIDs); err != nil {
				return invalid(err)
			}
		case fieldDedupe:
			if err := limits.ValidateDuration("dedupe_ms", a.DedupeMS); err != nil {
				return invalid(err)
			}
		case fieldID:
			if err := checkRequestID(a.RequestID, s.argv[i].kind == argIDRequired); err != nil {
				return err
			}
		case fieldWant:
			hi := a.Limit
			if s.argv[i].hi == "burst" {
				hi = a.Burst
			}
			if a.Want < a.Cost || a.Want > hi {
				return &Error{Code: CodeInvalid, Message: "want must be an integer from cost to " + s.argv[i].hi}
			}
		case fieldShare:
			if a.SharePPM < 1 || a.SharePPM > limits.ShareScale {
				return &Error{Code: CodeInvalid, Message: "max share must be an integer from 1 to " + strconv.Itoa(limits.ShareScale)}
			}
		case fieldSeq:
			if a.Seq < 1 || a.Seq > 1<<53-1 {
				return &Error{Code: CodeInvalid, Message: "seq must be an integer from 1 to 2^53-1"}
			}
		case fieldKept:
			if a.Kept < 0 || a.Kept > MaxLimit {
				return &Error{Code: CodeInvalid, Message: "kept must be an integer from 0 to " + strconv.Itoa(MaxLimit)}
			}
		}
	}
	return nil
}

// field is the field of Args an argument of a contract is written from.
type field int

const (
	fieldLimit field = iota
	fieldWindow
	fieldLease
	fieldRate
	fieldPeriod
	fieldBurst
	fieldCost
	fieldMaxIDs
	fieldDedupe
	fieldStrict
	fieldID
	fieldSpec
	fieldWant
	fieldShare
	fieldSeq
	fieldKept
	fieldEdge1 // and the next three
)

// fields are the fields of Args by the names of the contracts' arguments.
var fields = map[string]field{
	"limit": fieldLimit, "window": fieldWindow, "lease": fieldLease, "rate": fieldRate, "period": fieldPeriod,
	"burst": fieldBurst, "cost": fieldCost, "maxids": fieldMaxIDs, "dedupe": fieldDedupe, "strict": fieldStrict,
	"id": fieldID, "spec": fieldSpec, "want": fieldWant, "share": fieldShare, "seq": fieldSeq, "kept": fieldKept, "e1": fieldEdge1, "e2": fieldEdge1 + 1, "e3": fieldEdge1 + 2, "e4": fieldEdge1 + 3,
}

// fieldsOf are the fields a contract's ARGV is written from, in order; a
// name without a field is a fault of the package's own contracts, which
// every test finds at init.
func (c *contract) fieldsOf() []field {
	var out []field
	for _, x := range c.argv() {
		f, ok := fields[x.name]
		if !ok {
			panic("luascript: no field of Args for the argument " + x.name)
		}
		out = append(out, f)
	}
	return out
}

// text is the argument written from field f of a.
func (a *Args) text(f field) string {
	switch f {
	case fieldLimit:
		return decimal(a.Limit)
	case fieldWindow:
		return decimal(a.WindowMS)
	case fieldLease:
		return decimal(a.LeaseMS)
	case fieldRate:
		return decimal(a.Rate)
	case fieldPeriod:
		return decimal(a.PeriodMS)
	case fieldBurst:
		return decimal(a.Burst)
	case fieldCost:
		// A cost varies from call to call: formatted each time.
		return strconv.FormatInt(a.Cost, 10)
	case fieldMaxIDs:
		return decimal(a.MaxRequestIDs)
	case fieldDedupe:
		return decimal(a.DedupeMS)
	case fieldStrict:
		return flag(a.Strict)
	case fieldID:
		return a.RequestID
	case fieldSpec:
		return a.Spec
	case fieldWant:
		return strconv.FormatInt(a.Want, 10)
	case fieldShare:
		return decimal(a.SharePPM)
	case fieldSeq:
		return strconv.FormatInt(a.Seq, 10)
	case fieldKept:
		return strconv.FormatInt(a.Kept, 10)
	}
	return strconv.FormatInt(a.Periods.Edges[f-fieldEdge1], 10)
}

// call is the call of s with a's keys and arguments, all in one
// allocation: a.Key, or a calendar's three period keys.
func (s *script) call(a *Args) Call {
	nk := s.c.keys
	kv := make([]string, nk+len(s.fields))
	if nk == 1 {
		kv[0] = a.Key
	} else {
		for i, st := range a.Periods.Starts {
			kv[i] = CalendarPeriodKey(a.Key, st)
		}
	}
	for i, f := range s.fields {
		kv[nk+i] = a.text(f)
	}
	return Call{s: s, keys: kv[:nk:nk], args: kv[nk:]}
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
// milliseconds (limits.Bucket.RefillMS).
func (b TokenBucket) RefillMS() int64 { return limits.Bucket(b).RefillMS() }

// Validate checks the bounds the scripts check (limits.ValidateTokenBucket).
// The refill time is bounded by MaxWindowMS, so every time a bucket stores
// fits a key's TTL.
func (b TokenBucket) Validate() error {
	return invalid(limits.ValidateTokenBucket(b.Rate, b.PeriodMS, b.Burst))
}

// SlidingWindowKey is the key of the sliding window that (policy, subject)
// counts against, laid out as FixedWindowKey.
func SlidingWindowKey(prefix, policy, subject string) string {
	return layoutKey(prefix, "sw", policy, subject)
}
