// Package dispatch decides takes, peeks, releases and settles: it resolves a
// request's limits (a named policy from the config, or the request's
// inline limits), hands the decision to the request's algorithm, sends the
// algorithm's script call to Redis in a batch shared by every connection,
// and returns a typed Outcome that the connection renders once.
//
// It never decides quota itself: every decision is one Lua script in Redis
// (package luascript), so that concurrent callers in any number of pods
// agree. The one exception only ever denies, and only when Redis would
// (localdeny.go). It never retries a take in a way that could consume
// twice, and it never turns a Redis failure into an allow or a deny unless
// the policy's on_unavailable says so: the caller gets UNAVAILABLE and the
// outcome is unknown.
//
// # Adding an algorithm
//
//  1. Its shape and bounds in package limits (a Shape type with Validate and
//     Quota), and its Lua scripts with their builders and parsers in
//     luascript (see that package's doc).
//  2. One Go file here implementing Algorithm: Name, Key, Call, Parse and
//     DeniedFor (return 0 when a denial says nothing about the next take).
//     To settle its takes, a settleCall and a settleParse method (the
//     settler interface, settle.go); without them a settle of it is
//     INVALID.
//  3. One line in the algorithms registry (algorithm.go).
//  4. Its inline fields in protocol (algorithm.go: InlineShape and the
//     fields it accepts) and its policy fields in package policy
//     (Policy.Shape), each with their tests.
//  5. Tests against a real redis-server: its scripts in luascript, its
//     decisions here or through a sidecar in package sidecar.
//  6. What its RateLimit header fields say (headers.go): without more, a
//     decision renders the generic parameters, q (the shape's Quota), r
//     (remaining) and t (reset_ms in seconds). An algorithm with a window
//     or a unit adds a headerItem(limits.Shape, *Outcome) headerItem
//     method that starts from genericItem and sets w, qu, or drops t;
//     fixedwindow's, tokenbucket's and concurrency's are in headers.go.
//     A decision of several limits renders one list member per limit
//     with renderHeaders.
//
// Batching, deadlines, the breaker, the local denial, shadow mode,
// on_unavailable, the metrics and the decision log then work for it
// through the interface, and so does a take of several limits
// (multi.go), whose checks may be of any algorithm whose take script is
// in luascript's multiBodies.
package dispatch
