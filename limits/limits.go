// Package limits owns what a limit is, apart from where it is written and
// where it is kept: the algorithm names, the shapes (Window, Bucket,
// Leases, Sliding, CalendarWindow) with their validation and the arithmetic
// they imply (a bucket's refill time, a calendar's periods), and every
// bound of a request and a policy, each declared once here: the largest
// limit, window, lease count, request id, subject, policy name, timeout,
// and the checks of one take, with the rules messages give for them.
//
// The protocol decoder, the policy file and the Lua calls take them from
// here, so a bound cannot drift between them; the Lua scripts check the
// same numbers again (luascript's prelude is built from these constants).
// A test fails when another package declares one of these bounds or
// writes its number out in a message.
//
// It imports nothing of quotad's and never will: every other package may
// import it. It knows no wire, no policy file and no Redis.
package limits

import (
	"strconv"
	"time"
)

// Algorithms a request or a policy may name. An absent algorithm is
// FixedWindow, so requests written before there was a choice keep their
// meaning.
const (
	FixedWindow = "fixed_window"
	TokenBucket = "token_bucket"
	Concurrency = "concurrency"
)

// Bounds. Units are in the names.
const (
	// MaxLimit bounds a limit, a cost, a rate and a burst. Lua numbers
	// are doubles: every sum the scripts form stays far below 2^53.
	MaxLimit = 1_000_000_000
	// MaxWindowMS bounds every length of time a limit names: a window, a
	// period, a lease, a bucket's refill time (31 days). A sliding window's
	// key lives up to two windows.
	MaxWindowMS = 31 * 24 * 60 * 60 * 1000
	// MaxLeases bounds a concurrency limit: each take reads every lease of
	// its subject, so this bounds the work of one decision.
	MaxLeases = 100_000
	// MaxRequestIDBytes bounds a request id, which is stored in the hash.
	MaxRequestIDBytes = 64
	// MaxRequestIDs bounds a policy's max_request_ids: each record is a
	// hash field, so this bounds one key's size.
	MaxRequestIDs = 1_000_000
	// DefaultMaxRequestIDs caps the request id records of one window when
	// a policy (or inline limits) does not say.
	DefaultMaxRequestIDs = 10_000
	// MaxChecks bounds the checks of one take: the limits it takes from
	// at once, all or nothing, in one script call.
	MaxChecks = 8
	// MaxSubjectBytes bounds a subject, which is part of every key.
	MaxSubjectBytes = 256
	// MaxPolicyNameBytes bounds a policy's name, which is part of the keys
	// of its subjects.
	MaxPolicyNameBytes = 64
	// MaxTimeoutMS bounds the time a request may wait for its decision
	// (an hour).
	MaxTimeoutMS = 60 * 60 * 1000
	// MaxIDBytes bounds a request's id, which its reply echoes.
	MaxIDBytes = 128
)

// Bounds of Envoy's rate limit service (RLS): of a ShouldRateLimit request
// and of the descriptors file (rls/descriptors) that decides it. A request
// entry's key and value become part of a counter's key, so they are
// bounded like a subject.
const (
	// MaxRLSDescriptors bounds the descriptors of one request, each of
	// which may take from one counter.
	MaxRLSDescriptors = 64
	// MaxRLSEntries bounds the entries of one request descriptor, and so
	// the depth of the descriptors file: a deeper node can never match.
	MaxRLSEntries = 16
	// MaxRLSKeyBytes bounds a descriptor entry's key, in a request and in
	// the file.
	MaxRLSKeyBytes = 256
	// MaxRLSValueBytes bounds a descriptor entry's value, in a request and
	// in the file.
	MaxRLSValueBytes = 1024
	// MaxRLSConfigDescriptors bounds the descriptors of one domain file,
	// every level counted.
	MaxRLSConfigDescriptors = 100_000
	// MaxRLSUnitMultiplier bounds a rate_limit's unit_multiplier: a window
	// of that many units.
	MaxRLSUnitMultiplier = 1000
)

// MaxWindow is MaxWindowMS as a duration, for the policy file's durations;
// MaxWindowText is how messages name it.
const (
	MaxWindow     = MaxWindowMS * time.Millisecond
	MaxWindowText = "744h (31 days)"
)

// Error says which field of a shape is out of bounds and why.
type Error struct {
	Field   string
	Message string
}

func (e *Error) Error() string { return e.Message }

// outOfRange says field must be in lo..hi; suffix, when not empty, follows
// the range (" (31 days)").
func outOfRange(field string, lo, hi int64, suffix string) *Error {
	return &Error{Field: field, Message: field + " must be an integer from " + strconv.FormatInt(lo, 10) +
		" to " + strconv.FormatInt(hi, 10) + suffix}
}

// ValidateLimit checks a fixed window's limit (also a rate or a burst's range
// under another field name).
func ValidateLimit(field string, n int64) error {
	if n < 1 || n > MaxLimit {
		return outOfRange(field, 1, MaxLimit, "")
	}
	return nil
}

// ValidateDuration checks a length of time in milliseconds.
func ValidateDuration(field string, ms int64) error {
	if ms < 1 || ms > MaxWindowMS {
		return outOfRange(field, 1, MaxWindowMS, " (31 days)")
	}
	return nil
}

// ValidateFixedWindow checks a fixed window: limit per window_ms.
func ValidateFixedWindow(limit, windowMS int64) error {
	if err := ValidateLimit("limit", limit); err != nil {
		return err
	}
	return ValidateDuration("window_ms", windowMS)
}

// ValidateTokenBucket checks a token bucket: rate tokens per period_ms, burst
// tokens at most, and an empty bucket refills (burst * period_ms / rate)
// within MaxWindowMS, so every time it stores fits a key's TTL.
func ValidateTokenBucket(rate, periodMS, burst int64) error {
	if err := ValidateLimit("rate", rate); err != nil {
		return err
	}
	if err := ValidateDuration("period_ms", periodMS); err != nil {
		return err
	}
	if err := ValidateLimit("burst", burst); err != nil {
		return err
	}
	if burst*periodMS > MaxWindowMS*rate { // each side below 2^62
		return &Error{Field: "burst", Message: "burst * period_ms / rate (the time to refill from empty) must be at most " +
			strconv.FormatInt(MaxWindowMS, 10) + " ms (31 days)"}
	}
	return nil
}

// ValidateConcurrency checks a concurrency limit: limit leases of lease_ms.
func ValidateConcurrency(limit, leaseMS int64) error {
	if limit < 1 || limit > MaxLeases {
		return outOfRange("limit", 1, MaxLeases, " for concurrency")
	}
	return ValidateDuration("lease_ms", leaseMS)
}

// ValidateMaxRequestIDs checks a max_request_ids.
func ValidateMaxRequestIDs(n int64) error {
	if n < 1 || n > MaxRequestIDs {
		return outOfRange("max_request_ids", 1, MaxRequestIDs, "")
	}
	return nil
}

// ValidRequestID reports whether s is a request id: 1 to
// MaxRequestIDBytes of A-Z a-z 0-9 _ -.
func ValidRequestID(s string) bool {
	if s == "" || len(s) > MaxRequestIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// RequestIDRule is how messages describe a valid request id.
const RequestIDRule = "request_id must be 1 to 64 of A-Z a-z 0-9 _ -"

// ValidPolicyName reports whether s can name a policy: 1 to
// MaxPolicyNameBytes of A-Z a-z 0-9 _ . - (no ':', so the keys built from
// it stay unambiguous).
func ValidPolicyName(s string) bool {
	if s == "" || len(s) > MaxPolicyNameBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-', c == '.':
		default:
			return false
		}
	}
	return true
}

// PolicyNameChars is how messages describe a valid policy name, after the
// word "must be".
const PolicyNameChars = "1 to 64 of A-Z a-z 0-9 _ . -"

// ValidateTimeout checks a request's timeout_ms.
func ValidateTimeout(ms int64) error {
	if ms < 1 || ms > MaxTimeoutMS {
		return outOfRange("timeout_ms", 1, MaxTimeoutMS, "")
	}
	return nil
}

// ValidateSubject checks a subject's length; what it may hold is the
// protocol's to say.
func ValidateSubject(s string) error {
	if s == "" || len(s) > MaxSubjectBytes {
		return &Error{Field: "subject", Message: "subject must be 1 to " + strconv.Itoa(MaxSubjectBytes) + " bytes"}
	}
	return nil
}
