package luascript

import "strings"

// Key layout
//
//	<prefix>fw:{p:<policy>:<subject>}   window of a named policy
//	<prefix>fw:{i:<subject>}            window of an inline limit
//	<prefix>tb:{p:<policy>:<subject>}   token bucket, likewise
//	<prefix>cc:{p:<policy>:<subject>}   concurrency leases, likewise
//	<prefix>sw:{p:<policy>:<subject>}   sliding window, likewise (SlidingWindowKey)
//	<prefix>cal:{p:<policy>:<subject>}:<start ms>
//	                                    calendar window of the period starting then
//	<prefix>cal:{e:<counter>}:<start ms>
//	                                    calendar window of a counter of Envoy's rate
//	                                    limit service (EnvoyCalendarKey); rls/ starts
//	                                    each counter with "{<domain>}", so the key is
//	                                    <prefix>cal:e:{<domain>}...:<start ms>
//
// The p:/i:/e: marker keeps named, inline and Envoy's windows apart. Policy names are
// [A-Za-z0-9_.-]{1,64} with no colon, so the first colon after "p:" ends the
// name and two distinct (policy, subject) pairs never share a key, whatever
// bytes the subject holds. The braces make a Redis Cluster hash tag, so all
// keys of one decision hash to one slot; a subject holding '}' only ends the
// tag early, and it still ends at the same byte for every key of the decision.
//
// A subject may name its own hash tag: one holding a "{" with a "}" after
// it and something between, such as "{tenant-42}:user-7", has keys without
// the braces around the marker,
//
//	<prefix>fw:p:<policy>:{tenant-42}:user-7
//	<prefix>fw:i:{tenant-42}:user-7
//
// so that its tag is the key's: every key of every subject holding
// {tenant-42}, of any policy and algorithm, is in one slot, and a take of
// several limits on them is one script on a Redis Cluster. The two forms
// never share a key: after the algorithm's colon one has "{", the other
// "p:" or "i:".

// FixedWindowKey is the key of the window that (policy, subject) counts
// against; policy "" means an inline limit. policy must already be a valid
// policy name.
func FixedWindowKey(prefix, policy, subject string) string {
	return layoutKey(prefix, "fw", policy, subject)
}

// TokenBucketKey is the key of the token bucket that (policy, subject) takes
// from, laid out as FixedWindowKey. Each algorithm has its own prefix, so a
// policy whose algorithm changes starts on fresh keys and never reads
// another algorithm's state.
func TokenBucketKey(prefix, policy, subject string) string {
	return layoutKey(prefix, "tb", policy, subject)
}

// ConcurrencyKey is the key of the lease set of (policy, subject), laid out
// as FixedWindowKey.
func ConcurrencyKey(prefix, policy, subject string) string {
	return layoutKey(prefix, "cc", policy, subject)
}

// CalendarKey is the part of the calendar windows' keys of (policy,
// subject) that every period shares, laid out as FixedWindowKey; each
// period's window is CalendarPeriodKey of it.
func CalendarKey(prefix, policy, subject string) string {
	return layoutKey(prefix, "cal", policy, subject)
}

// EnvoyCalendarKey is the part of the calendar windows' keys of one
// counter of Envoy's rate limit service (rls/: a descriptor's domain and
// entries, as one string) that every period shares, laid out as
// CalendarKey but under its own marker, so that no counter shares a key
// with a policy's or an inline limit's subject.
func EnvoyCalendarKey(prefix, counter string) string {
	return markedKey(prefix, "cal", "e:", counter)
}

// Layout is how one algorithm's keys look in Redis, for tools that read
// them (quotad doctor) rather than decide.
type Layout struct {
	// Tag is the part of the key between the prefix and the first colon.
	Tag       string
	Algorithm string
	// IDMatch is the HSCAN pattern of the hash's request-id records; ""
	// for an algorithm whose fields are not records worth counting (a
	// concurrency set's leases, at most its limit).
	IDMatch string
	// Fixed is how many fields the hash has besides the records.
	Fixed int64
	// WindowField names a field "<limit>:<window_ms>" that records how
	// long the key lives; "" when the hash records no such length.
	WindowField string
}

// Layouts lists every algorithm's key layout.
var Layouts = []Layout{
	// used, policy and ids.
	{Tag: "fw", Algorithm: "fixed_window", IDMatch: "r:*", Fixed: 3, WindowField: "policy"},
	// Six state fields; each record also has a q:<n> queue entry.
	{Tag: "tb", Algorithm: "token_bucket", IDMatch: "r:*", Fixed: 6},
	{Tag: "cc", Algorithm: "concurrency"},
	// s, c, p, policy, ids, qh and qt; each record also has a q:<n> queue
	// entry. Its policy field gives the window: a key lives two windows at
	// most, so a TTL of one window, which doctor --fix gives, only ever
	// forgets use early.
	{Tag: "sw", Algorithm: "sliding_window", IDMatch: "r:*", Fixed: 7, WindowField: "policy"},
	// used, policy and ids; the key's last part names its period.
	{Tag: "cal", Algorithm: "calendar", IDMatch: "r:*", Fixed: 3},
}

// ReservationPrefix starts the field of a window's or bucket's hash that
// records a sidecar's allotment, a:<holder> "<seq>:<units>" (a sliding
// window's: "<seq>:<units>:<period start ms>"): part of the state, beside
// any algorithm's fixed fields and records (allotment.go).
const ReservationPrefix = "a:"

// LayoutOf returns the layout whose Tag is tag.
func LayoutOf(tag string) (Layout, bool) {
	for _, l := range Layouts {
		if l.Tag == tag {
			return l, true
		}
	}
	return Layout{}, false
}

// layoutKey is the key of (policy, subject) under the algorithm's tag alg,
// as the layout above says.
func layoutKey(prefix, alg, policy, subject string) string {
	marker := "i:"
	if policy != "" {
		marker = "p:" + policy + ":"
	}
	return markedKey(prefix, alg, marker, subject)
}

// markedKey is the key of subject under the algorithm's tag alg and the
// marker of its kind of limit.
func markedKey(prefix, alg, marker, subject string) string {
	if HasHashTag(subject) {
		return prefix + alg + ":" + marker + subject
	}
	return prefix + alg + ":{" + marker + subject + "}"
}

// HasHashTag reports whether s holds a Redis Cluster hash tag: a "{"
// followed, later, by a "}", with something between the first of them.
func HasHashTag(s string) bool {
	i := strings.IndexByte(s, '{')
	return i >= 0 && strings.IndexByte(s[i+1:], '}') > 0
}
