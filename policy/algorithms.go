package policy

import (
	"strconv"
	"time"

	"quotad/limits"
)

// A policy names one of package limits' algorithms. A policy whose
// algorithm changes counts on new keys (each algorithm has its own key
// prefix), so its subjects start fresh; no algorithm ever reads another's
// state. A sliding window has the fixed window's fields: limit, window and
// max_request_ids.

// foreignFields refuses a field that belongs to another algorithm, so a
// policy never silently ignores what its author meant to set. Names a known
// algorithm only; an unknown one is reported by the caller.
func foreignFields(algo string, fp filePolicy, fail func(field, msg string) error) error {
	given := map[string]bool{
		"limit":           !fp.Limit.IsZero(),
		"window":          fp.Window != "",
		"max_request_ids": !fp.MaxRequestIDs.IsZero(),
		"rate":            !fp.Rate.IsZero(),
		"period":          fp.Period != "",
		"burst":           !fp.Burst.IsZero(),
		"dedupe":          fp.Dedupe != "",
		"lease":           fp.Lease != "",
		"time_zone":       fp.TimeZone != "",
		"week_start":      fp.WeekStart != "",
		"jitter":          fp.Jitter != "",
	}
	var own []string
	switch algo {
	case limits.FixedWindow:
		own = []string{"limit", "window", "max_request_ids"}
	case limits.TokenBucket:
		own = []string{"rate", "period", "burst", "dedupe", "max_request_ids"}
	case limits.Concurrency:
		own = []string{"limit", "lease"}
	case limits.SlidingWindow:
		own = []string{"limit", "window", "max_request_ids"}
	case limits.Calendar:
		own = calendarOwn
	default:
		return nil
	}
	for _, f := range own {
		delete(given, f)
	}
	for _, f := range []string{"limit", "window", "max_request_ids", "rate", "period", "burst", "dedupe", "lease", "time_zone", "week_start", "jitter"} {
		if given[f] {
			return fail(f, "is not a field of "+algo)
		}
	}
	return nil
}

// durationMS parses a Go duration of whole milliseconds from 1ms to
// limits.MaxWindow.
func durationMS(s string) (int64, bool) {
	d, err := time.ParseDuration(s)
	if err != nil || d%time.Millisecond != 0 || d < time.Millisecond || d > limits.MaxWindow {
		return 0, false
	}
	return d.Milliseconds(), true
}

func buildTokenBucket(p *Policy, fp filePolicy, fail func(field, msg string) error) (*Policy, error) {
	if fp.Rate.IsZero() {
		return nil, fail("rate", "is required (tokens per period)")
	}
	rate, ok := intField(fp.Rate)
	if !ok || rate < 1 || rate > limits.MaxLimit {
		return nil, fail("rate", limitRange+quote(fp.Rate.Value))
	}
	if fp.Period == "" {
		return nil, fail("period", "is required (a duration such as 1s, 1m, 1h)")
	}
	period, ok := durationMS(fp.Period)
	if !ok {
		return nil, fail("period", durationRange+quote(fp.Period))
	}
	burst := rate
	if !fp.Burst.IsZero() {
		if burst, ok = intField(fp.Burst); !ok || burst < 1 || burst > limits.MaxLimit {
			return nil, fail("burst", limitRange+quote(fp.Burst.Value))
		}
	}
	bucket := limits.Bucket{Rate: rate, PeriodMS: period, Burst: burst}
	if err := bucket.Validate(); err != nil {
		return nil, fail("burst", "burst * period / rate, the time to refill from empty, must be at most "+limits.MaxWindowText)
	}
	p.Rate, p.PeriodMS, p.Burst, p.Limit = rate, period, burst, burst
	p.DedupeMS = bucket.RefillMS()
	if fp.Dedupe != "" {
		if p.DedupeMS, ok = durationMS(fp.Dedupe); !ok {
			return nil, fail("dedupe", durationRange+quote(fp.Dedupe))
		}
	}
	if err := readMaxRequestIDs(p, fp, fail); err != nil {
		return nil, err
	}
	return p, nil
}

// readMaxRequestIDs reads a max_request_ids, when given, into p.
func readMaxRequestIDs(p *Policy, fp filePolicy, fail func(field, msg string) error) error {
	if fp.MaxRequestIDs.IsZero() {
		return nil
	}
	n, ok := intField(fp.MaxRequestIDs)
	if !ok || limits.ValidateMaxRequestIDs(n) != nil {
		return fail("max_request_ids", maxIDsRange+quote(fp.MaxRequestIDs.Value))
	}
	p.MaxRequestIDs = n
	return nil
}

func buildConcurrency(p *Policy, fp filePolicy, fail func(field, msg string) error) (*Policy, error) {
	if fp.Limit.IsZero() {
		return nil, fail("limit", "is required (leases held at once)")
	}
	limit, ok := intField(fp.Limit)
	if !ok || limit < 1 || limit > limits.MaxLeases {
		return nil, fail("limit", "must be an integer from 1 to "+strconv.Itoa(limits.MaxLeases)+", got "+quote(fp.Limit.Value))
	}
	if fp.Lease == "" {
		return nil, fail("lease", "is required (a duration such as 30s)")
	}
	lease, ok := durationMS(fp.Lease)
	if !ok {
		return nil, fail("lease", durationRange+quote(fp.Lease))
	}
	p.Limit, p.LeaseMS, p.MaxRequestIDs = limit, lease, 0
	return p, nil
}
