package luascript

// Key layout
//
//	<prefix>fw:{p:<policy>:<subject>}   window of a named policy
//	<prefix>fw:{i:<subject>}            window of an inline limit
//	<prefix>tb:{p:<policy>:<subject>}   token bucket, likewise
//	<prefix>cc:{p:<policy>:<subject>}   concurrency leases, likewise
//
// The p:/i: marker keeps named and inline windows apart. Policy names are
// [A-Za-z0-9_.-]{1,64} with no colon, so the first colon after "p:" ends the
// name and two distinct (policy, subject) pairs never share a key, whatever
// bytes the subject holds. The braces make a Redis Cluster hash tag, so all
// keys of one decision hash to one slot; a subject holding '}' only ends the
// tag early, and it still ends at the same byte for every key of the decision.

// FixedWindowKey is the key of the window that (policy, subject) counts
// against; policy "" means an inline limit. policy must already be a valid
// policy name.
func FixedWindowKey(prefix, policy, subject string) string {
	if policy == "" {
		return prefix + "fw:{i:" + subject + "}"
	}
	return prefix + "fw:{p:" + policy + ":" + subject + "}"
}

// TokenBucketKey is the key of the token bucket that (policy, subject) takes
// from, laid out as FixedWindowKey. Each algorithm has its own prefix, so a
// policy whose algorithm changes starts on fresh keys and never reads
// another algorithm's state.
func TokenBucketKey(prefix, policy, subject string) string {
	if policy == "" {
		return prefix + "tb:{i:" + subject + "}"
	}
	return prefix + "tb:{p:" + policy + ":" + subject + "}"
}

// ConcurrencyKey is the key of the lease set of (policy, subject), laid out
// as FixedWindowKey.
func ConcurrencyKey(prefix, policy, subject string) string {
	if policy == "" {
		return prefix + "cc:{i:" + subject + "}"
	}
	return prefix + "cc:{p:" + policy + ":" + subject + "}"
}
