// Package luascript holds quotad's embedded Lua scripts and the typed Go calls
// over them. Each decision is one script run, so it is atomic on a single
// Redis and in a Redis Cluster (all its keys share a hash tag, see key.go).
//
// # Fixed window
//
// A window is a Redis hash at FixedWindowKey with these fields:
//
//	used          units consumed in the window, decimal
//	policy        "<limit>:<window_ms>" it was last written under
//	ids           number of r:* records, decimal
//	r:<id>        "<cost>:<used right after acceptance>", one per accepted request id
//
// The window opens at its first accepted take and expires window_ms later
// (PEXPIRE on creation only). It is neither clock-aligned nor sliding, and
// retries, replays and policy changes never move its end. A take is accepted
// iff used + cost <= limit. Request ids are recorded only when accepted, so a
// denied id can be tried again, and after expiry every id is new.
//
// Each window records at most MaxRequestIDs request ids: a new id that would
// be accepted once the cap is reached fails with ErrRequestIDsFull and
// nothing is written. Takes without a request id and replays of recorded ids
// still work. The cap bounds the memory one window can hold.
//
// Every key the scripts write has a TTL. A window found without one (removed
// by hand or by another writer) gets window_ms on the next take, whatever
// that take's outcome, and TakeResult.Healed reports it; without that its
// quota would never come back.
//
// # Token bucket (GCRA)
//
// A bucket is a Redis hash at TokenBucketKey:
//
//	tat           theoretical arrival time, whole µs of Redis's clock (TIME)
//	rem           the TAT's fraction, in 1/rate of a µs, so nothing is rounded
//	policy        "<rate>:<period_ms>:<burst>" it was last written under
//	ids           number of r:* records
//	qh, qt        head and tail of the queue of records, in order of expiry
//	q:<n>         "<id>:<expiry ms>", one per recorded acceptance
//	r:<id>        "<cost>:<remaining right after acceptance>:<expiry ms>"
//
// A token lasts period/rate; the bucket is full when tat <= now. A take of
// cost is accepted iff tat + cost*period/rate - burst*period/rate <= now,
// and then tat moves on by cost*period/rate. An accepted request id is a
// replay for its dedupe horizon; every accepted take forgets up to three
// records past their horizon, so the records stay bounded under continuous
// traffic. The key lives until the bucket is full again or its newest record
// expires, whichever is later.
//
// # Concurrency leases
//
// A lease set is a Redis hash at ConcurrencyKey:
//
//	policy        "<limit>:<lease_ms>" it was last written under
//	l:<id>        expiry of the lease named id, ms of Redis's clock
//
// A take acquires or renews (a heartbeat) the lease named by its request id;
// a release deletes it. Every take and release reclaims expired leases, so a
// holder that died blocks the subject for at most lease_ms. The key lives
// exactly as long as its last lease, and is deleted when none is left.
//
// # Calendar window
//
// A calendar window is a fixed window aligned to the calendar of a time
// zone (limits.CalendarWindow): one Redis hash per period, at
// CalendarPeriodKey(CalendarKey(...), start ms), with the fields of a
// fixed window, its policy field holding CalendarWindow.Spec:
//
//	used          units consumed in the period, decimal
//	policy        "<limit>:<period>:<zone>:<week_start>:<jitter_ms>"
//	ids           number of r:* records, decimal
//	r:<id>        "<cost>:<used right after acceptance>"
//
// Redis has no zone database and the callers' clocks disagree, so the
// caller computes three consecutive periods around its own clock
// (CalendarAround, in Go) and the script decides in the one holding
// Redis's TIME: every caller counts an instant in the same period, whatever
// its skew below a period; beyond that the reply is CLOCK_SKEW and nothing
// is written. The key expires a second after its period ends,
// and a key found without a TTL gets that again.
//
// Peek scripts start with "#!lua flags=no-writes" (see scripts.go).
//
// # What this package must never do
//
// It never retries a take: after a lost reply only the caller knows whether
// a request id makes a second attempt safe. It never writes before validating
// every argument, never leaves a key without a TTL, and never imports the
// socket or protocol layers; it takes a rueidis.Client and arguments, and
// returns results or *Error.
package luascript
