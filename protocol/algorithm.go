package protocol

import "strconv"

// Algorithms a request or a policy may name. An absent algorithm is
// AlgorithmFixedWindow, so requests written before there was a choice keep
// their meaning.
const (
	AlgorithmFixedWindow = "fixed_window"
	AlgorithmTokenBucket = "token_bucket"
	AlgorithmConcurrency = "concurrency"
)

// MaxLeases bounds a concurrency limit: each take reads every lease of its
// subject, so this bounds the work of one decision.
const MaxLeases = 100_000

// algorithmFields are the inline fields beyond limit and window_ms.
const algorithmFields = fieldAlgorithm | fieldRate | fieldPeriodMS | fieldBurst | fieldLeaseMS

// inline fields each algorithm accepts; any other inline field is INVALID,
// so a field meant for another algorithm is never silently ignored.
var algorithmInline = map[string]field{
	AlgorithmFixedWindow: fieldAlgorithm | fieldLimit | fieldWindowMS,
	AlgorithmTokenBucket: fieldAlgorithm | fieldRate | fieldPeriodMS | fieldBurst,
	AlgorithmConcurrency: fieldAlgorithm | fieldLimit | fieldLeaseMS,
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
		return invalid("unknown algorithm " + strconv.Quote(algo) + ": one of fixed_window, token_bucket, concurrency")
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
		if r.Limit < 1 || r.Limit > MaxLimit {
			return invalid("limit must be an integer from 1 to 1000000000")
		}
		if r.WindowMS < 1 || r.WindowMS > MaxWindowMS {
			return invalid("window_ms must be an integer from 1 to 2678400000 (31 days)")
		}
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
		if r.Limit < 1 || r.Limit > MaxLeases {
			return invalid("limit must be an integer from 1 to 100000 for concurrency")
		}
		if r.LeaseMS < 1 || r.LeaseMS > MaxWindowMS {
			return invalid("lease_ms must be an integer from 1 to 2678400000 (31 days)")
		}
	}
	return nil
}

// ValidTokenBucket checks a token bucket's shape: rate tokens per period_ms,
// burst tokens at most, and an empty bucket refills (burst * period_ms /
// rate) within 31 days, so every time it stores fits a key's TTL.
func ValidTokenBucket(rate, periodMS, burst int64) error {
	switch {
	case rate < 1 || rate > MaxLimit:
		return invalid("rate must be an integer from 1 to 1000000000")
	case periodMS < 1 || periodMS > MaxWindowMS:
		return invalid("period_ms must be an integer from 1 to 2678400000 (31 days)")
	case burst < 1 || burst > MaxLimit:
		return invalid("burst must be an integer from 1 to 1000000000")
	case burst*periodMS > MaxWindowMS*rate: // each side below 2^62
		return invalid("burst * period_ms / rate (the time to refill from empty) must be at most 2678400000 ms (31 days)")
	}
	return nil
}

// validateRelease: a release names the lease it frees.
func (r *Request) validateRelease() error {
	if r.fields&fieldRequestID == 0 {
		return invalid("release needs the request_id of the lease")
	}
	if !validRequestID(r.RequestID) {
		return invalid("request_id must be 1 to 64 of A-Z a-z 0-9 _ -")
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
	} {
		if f&n.f != 0 {
			return n.name
		}
	}
	return "a field"
}
