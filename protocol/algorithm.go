package protocol

import (
	"strconv"

	"quotad/limits"
)

// Algorithms a request or a policy may name. An absent algorithm is
// AlgorithmFixedWindow, so requests written before there was a choice keep
// their meaning.
const (
	AlgorithmFixedWindow = limits.FixedWindow
	AlgorithmTokenBucket = limits.TokenBucket
	AlgorithmConcurrency = limits.Concurrency
	AlgorithmCalendar    = limits.Calendar
)

// AlgorithmSlidingWindow is the two-window counter (limits.Sliding).
const AlgorithmSlidingWindow = limits.SlidingWindow

// algorithmFields are the inline fields beyond limit and window_ms.
const algorithmFields = fieldAlgorithm | fieldRate | fieldPeriodMS | fieldBurst | fieldLeaseMS | calendarFields

// inline fields each algorithm accepts; any other inline field is INVALID,
// so a field meant for another algorithm is never silently ignored.
var algorithmInline = map[string]field{
	AlgorithmFixedWindow:   fieldAlgorithm | fieldLimit | fieldWindowMS,
	AlgorithmTokenBucket:   fieldAlgorithm | fieldRate | fieldPeriodMS | fieldBurst,
	AlgorithmConcurrency:   fieldAlgorithm | fieldLimit | fieldLeaseMS,
	AlgorithmSlidingWindow: fieldAlgorithm | fieldLimit | fieldWindowMS,
	AlgorithmCalendar:      fieldAlgorithm | fieldLimit | calendarFields,
}

// validateAlgorithm checks the inline form of a request that gave an
// algorithm or one of its fields.
func (r *Request) validateAlgorithm(hasPolicy bool) error {
	if hasPolicy {
		return invalid("give either policy or inline limits, not both: a policy sets its own algorithm")
	}
	algo := r.Algorithm
	if r.fields&fieldAlgorithm == 0 {
		algo = AlgorithmFixedWindow
	}
	allowed, ok := algorithmInline[algo]
	if !ok {
		return invalid("unknown algorithm " + strconv.Quote(algo) + ": one of fixed_window, token_bucket, concurrency, sliding_window, calendar")
	}
	inline := fieldLimit | fieldWindowMS | algorithmFields
	if extra := r.fields & inline &^ allowed; extra != 0 {
		return invalid(fieldName(extra) + " is not a field of " + algo)
	}
	switch algo {
	case AlgorithmFixedWindow:
		if r.fields&fieldLimit == 0 || r.fields&fieldWindowMS == 0 {
			return invalid("fixed_window needs limit and window_ms")
		}
		return invalidShape(limits.ValidateFixedWindow(r.Limit, r.WindowMS))
	case AlgorithmTokenBucket:
		if r.fields&fieldRate == 0 || r.fields&fieldPeriodMS == 0 {
			return invalid("token_bucket needs rate and period_ms (burst defaults to rate)")
		}
		if r.fields&fieldBurst == 0 {
			r.Burst = r.Rate
		}
		return ValidTokenBucket(r.Rate, r.PeriodMS, r.Burst)
	case AlgorithmConcurrency:
		if r.fields&fieldLimit == 0 || r.fields&fieldLeaseMS == 0 {
			return invalid("concurrency needs limit and lease_ms")
		}
		return invalidShape(limits.ValidateConcurrency(r.Limit, r.LeaseMS))
	case AlgorithmSlidingWindow:
		if r.fields&fieldLimit == 0 || r.fields&fieldWindowMS == 0 {
			return invalid("sliding_window needs limit and window_ms")
		}
		return invalidShape(limits.Sliding{Limit: r.Limit, WindowMS: r.WindowMS}.Validate())
	case AlgorithmCalendar:
		return r.validateCalendar()
	}
	return nil
}

// invalidShape turns a limits validation's error into an INVALID reply.
func invalidShape(err error) error {
	if err == nil {
		return nil
	}
	return invalid(err.Error())
}

// ValidTokenBucket checks a token bucket's shape: rate tokens per period_ms,
// burst tokens at most, and an empty bucket refills (burst * period_ms /
// rate) within 31 days, so every time it stores fits a key's TTL.
func ValidTokenBucket(rate, periodMS, burst int64) error {
	return invalidShape(limits.ValidateTokenBucket(rate, periodMS, burst))
}

// validateRelease: a release names the lease it frees.
func (r *Request) validateRelease() error {
	if r.fields&fieldRequestID == 0 {
		return invalid("release needs the request_id of the lease")
	}
	if !limits.ValidRequestID(r.RequestID) {
		return invalid(limits.RequestIDRule)
	}
	return nil
}

// InlineAlgorithm is the algorithm of the request's inline limits: an
// absent algorithm is fixed_window. A named policy sets its own instead.
func (r *Request) InlineAlgorithm() string {
	if r.Algorithm == "" {
		return AlgorithmFixedWindow
	}
	return r.Algorithm
}

// fieldName names the lowest field set in f, for messages.
func fieldName(f field) string {
	for _, n := range []struct {
		f    field
		name string
	}{
		{fieldLimit, "limit"}, {fieldWindowMS, "window_ms"}, {fieldAlgorithm, "algorithm"}, {fieldRate, "rate"},
		{fieldPeriodMS, "period_ms"}, {fieldBurst, "burst"}, {fieldLeaseMS, "lease_ms"},
		{fieldPeriod, "period"}, {fieldTimeZone, "time_zone"}, {fieldWeekStart, "week_start"}, {fieldJitterMS, "jitter_ms"},
	} {
		if f&n.f != 0 {
			return n.name
		}
	}
	return "a field"
}

// InlineShape is the limit a request's inline fields describe, once Decode
// has validated them; nil when the request names a policy instead.
func (r *Request) InlineShape() limits.Shape {
	if r.Policy != "" || !r.HasInline() {
		return nil
	}
	switch r.InlineAlgorithm() {
	case AlgorithmTokenBucket:
		return limits.Bucket{Rate: r.Rate, PeriodMS: r.PeriodMS, Burst: r.Burst}
	case AlgorithmConcurrency:
		return limits.Leases{Limit: r.Limit, LeaseMS: r.LeaseMS}
	case AlgorithmSlidingWindow:
		return limits.Sliding{Limit: r.Limit, WindowMS: r.WindowMS}
	case AlgorithmCalendar:
		return r.calendarShape()
	}
	return limits.Window{Limit: r.Limit, WindowMS: r.WindowMS}
}
