package limits

// Shape is a limit of one algorithm: what a policy or a request's inline
// fields describe. Every Shape is a comparable value, so two decisions
// under the same limits compare equal.
type Shape interface {
	// Algorithm is the algorithm's name: FixedWindow, TokenBucket,
	// SlidingWindow, Calendar or
	// Concurrency.
	Algorithm() string
	// Validate reports the first bound the shape breaks, as an *Error.
	Validate() error
	// Quota is the most one subject may hold at once: the limit, or a
	// bucket's burst. Replies report it as "limit".
	Quota() int64
}

// Window is a fixed window: Limit units per WindowMS, the window opening
// at its first accepted take.
type Window struct {
	Limit    int64
	WindowMS int64
}

func (Window) Algorithm() string { return FixedWindow }
func (w Window) Validate() error { return ValidateFixedWindow(w.Limit, w.WindowMS) }
func (w Window) Quota() int64    { return w.Limit }

// Bucket is a token bucket (GCRA): Rate tokens per PeriodMS, at most Burst
// held.
type Bucket struct {
	Rate     int64
	PeriodMS int64
	Burst    int64
}

func (Bucket) Algorithm() string { return TokenBucket }
func (b Bucket) Validate() error { return ValidateTokenBucket(b.Rate, b.PeriodMS, b.Burst) }
func (b Bucket) Quota() int64    { return b.Burst }

// RefillMS is how long an empty bucket takes to fill, rounded up: the
// longest a bucket's state matters.
func (b Bucket) RefillMS() int64 { return (b.Burst*b.PeriodMS + b.Rate - 1) / b.Rate }

// Leases is a concurrency limit: at most Limit leases held at once, each
// for LeaseMS unless released or renewed.
type Leases struct {
	Limit   int64
	LeaseMS int64
}

func (Leases) Algorithm() string { return Concurrency }
func (l Leases) Validate() error { return ValidateConcurrency(l.Limit, l.LeaseMS) }
func (l Leases) Quota() int64    { return l.Limit }

// SlidingWindow is the algorithm of a Sliding limit.
const SlidingWindow = "sliding_window"

// Sliding is a sliding window: at most Limit units in any WindowMS, as
// estimated by the two-window counter (the current and previous periods of
// WindowMS, aligned to Redis's clock).
type Sliding struct {
	Limit    int64
	WindowMS int64
}

func (Sliding) Algorithm() string { return SlidingWindow }
func (s Sliding) Validate() error { return ValidateFixedWindow(s.Limit, s.WindowMS) }
func (s Sliding) Quota() int64    { return s.Limit }
