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
// # What this package must never do
//
// It never retries a take: after a lost reply only the caller knows whether
// a request id makes a second attempt safe. It never writes before validating
// every argument, never leaves a key without a TTL, and never imports the
// socket or protocol layers; it takes a rueidis.Client and arguments, and
// returns results or *Error.
package luascript
