package descriptors

import "strings"

// Unit is a rate limit's unit of time, numbered as go-control-plane's
// RateLimitResponse_RateLimit_Unit (envoy.service.ratelimit.v3), so a
// conversion is a cast.
type Unit int32

// Units, with the numbers of the protocol's enum.
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

var unitNames = [...]string{"UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"}

// String is the enum's name, as the protocol spells it (SECOND).
func (u Unit) String() string {
	if u >= 0 && int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "UNKNOWN"
}

// Seconds is the unit's length as envoyproxy/ratelimit counts it: its
// windows are aligned to the Unix epoch, a month is 30 days and a year
// 365 days. 0 for UnitUnknown.
func (u Unit) Seconds() int64 {
	switch u {
	case UnitSecond:
		return 1
	case UnitMinute:
		return 60
	case UnitHour:
		return 60 * 60
	case UnitDay:
		return 24 * 60 * 60
	case UnitWeek:
		return 7 * 24 * 60 * 60
	case UnitMonth:
		return 30 * 24 * 60 * 60
	case UnitYear:
		return 365 * 24 * 60 * 60
	}
	return 0
}

// parseUnit reads a unit as the file writes it, in any case; UnitUnknown
// is not a unit a file may name.
func parseUnit(s string) (Unit, bool) {
	up := strings.ToUpper(s)
	for u := UnitSecond; int(u) < len(unitNames); u++ {
		if unitNames[u] == up {
			return u, true
		}
	}
	return UnitUnknown, false
}

// Entry is one entry of a request descriptor: Envoy's
// RateLimitDescriptor.Entry.
type Entry struct {
	Key, Value string
}

// RateLimit is the rate_limit of a descriptor in the file, with the flags
// of that descriptor that decide how it is applied. It is shared by every
// request that matches it: never modify one.
type RateLimit struct {
	// Name is the rate_limit's name, which another's replaces may name.
	Name string
	// RequestsPerUnit is the limit per window; 0 refuses every request.
	RequestsPerUnit uint32
	// Unit and UnitMultiplier make the window: UnitMultiplier units
	// (quotad's extension; 1 when the file does not say).
	Unit           Unit
	UnitMultiplier uint32
	// Unlimited answers OK without a counter.
	Unlimited bool
	// ShadowMode answers OK whatever the counter says; the counter still
	// counts. QuotaMode: over the limit answers OK and marks the status
	// (envoyproxy/ratelimit's quota mode).
	ShadowMode bool
	QuotaMode  bool
	// DetailedMetric and ValueToMetric change Match.MetricKey only.
	DetailedMetric bool
	ValueToMetric  bool
	// Replaces names the rate limits this one drops when both match one
	// request.
	Replaces []string
	// Metadata is the descriptor's metadata, decoded to the types
	// structpb.NewStruct takes (map[string]any, []any, string, bool,
	// int64, float64, nil); nil when the descriptor has none.
	Metadata map[string]any
	// Policy is the quotad policy (quotad_policy) that decides this
	// descriptor instead of Unit and RequestsPerUnit; empty when none.
	Policy string
}

// Match is what a request descriptor matched.
type Match struct {
	// Limit is the matched rate limit.
	Limit *RateLimit
	// Key identifies the counter: the domain and each entry's key and
	// value as the request gave them, or the wildcard pattern for an
	// entry matched by a share_threshold wildcard. Unambiguous: each part
	// is length-prefixed.
	Key string
	// Path names the matched descriptor of the file as envoyproxy/ratelimit
	// names its stats: domain.key_value.key (the file's values, wildcards
	// as written). Its cardinality is the file's, so it may label metrics.
	Path string
	// MetricKey is the key envoyproxy/ratelimit gives the descriptor's
	// stats once detailed_metric and value_to_metric are applied; Path
	// when neither applies. It may hold request values: mind cardinality.
	MetricKey string
}
