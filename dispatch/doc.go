// Package dispatch decides takes, peeks, releases and settles: it resolves a
// request's limits (a named policy from the config, or the request's
// inline limits), hands the decision to the limits' algorithms, sends the
// decision's one script call to Redis, and returns a typed Outcome that
// the connection renders once.
//
// It never decides quota itself: every decision is one Lua script in Redis
// (package luascript), so that concurrent callers in any number of pods
// agree. The one exception only ever denies, and only when Redis would
// (localdeny.go). It never retries a take in a way that could consume
// twice, and it never turns a Redis failure into an allow or a deny unless
// the policy's on_unavailable says so: the caller gets UNAVAILABLE and the
// outcome is unknown.
//
// # A decision
//
// A Decision is decided against a list of checks: a request without
// "checks" is a list of one (its own limits), a take with "checks" one
// check per element. A take of one limit is a take of one check, and
// every rule is written once, over the list (checks.go):
//
//   - Prepare resolves each check's limits, has its Algorithm build its
//     call, and builds the decision's one script call: a lone check's own,
//     or the take of all the checks (luascript.TakeChecksCall).
//   - Run answers a take from the local denial when it can
//     (localDenied), or sends the call by the route that route chooses
//     (route.go): in the shared batch (batcher.go), alone under the
//     request's shorter timeout_ms, whole on the embedded store's one
//     node, or in steps across a Redis Cluster's nodes (steps.go). deadline
//     is the one place a call's deadline is computed; each call records
//     its timing (trip), from which a timeout is judged.
//   - complete reads the reply into each check's Outcome through its
//     Algorithm (read), and conclude feeds the local denial, applies
//     shadow mode and writes the take's verdict over the checks (verdict).
//   - Every failure ends in end: classify (failure.go) is the one place an
//     error becomes its wire code, its metric label and what the breaker
//     learns, and undecided applies on_unavailable.
//   - finish counts the decision (metrics.go: one series per check) and
//     logs it; the reply's header fields have one member per check
//     (headers.go).
//   - With a tracer, the decision is a span from Prepare to finish, a
//     child of the request's trace context, and each script call that
//     carries it a span too (trace.go); its log lines and latency
//     exemplar name its trace.
//
// A lone check's Outcome is the decision's Outcome itself (Outcome.check),
// so a request without "checks" gets the reply of a take of one limit; a
// take with "checks" gets one member per check.
//
// # Adding an algorithm
//
//  1. Its shape and bounds in package limits (a Shape type with Validate and
//     Quota, and its name among the algorithm names), and its Lua scripts
//     in luascript: each declared once in its contract, registered in
//     luascript's algorithms, and its take among the takeBodies a take of
//     several checks runs and gives back (see that package's doc: its
//     "Adding a script" list, and the test that fails when a registered
//     algorithm lacks a piece).
//  2. One Go file here implementing Algorithm: Name, Key, Call and
//     DeniedFor (return 0 when a denial says nothing about the next take).
//     Its replies need no parser of their own: every script of an op
//     replies in one layout, which parseReply reads (reply.go). A settle
//     of it works when luascript has its settle script (luascript.Settles);
//     without one a settle of it is INVALID. When its state recovers while
//     a denial holds (a bucket refills), a localState method (localStater,
//     localdeny.go).
//  3. One line in the algorithms registry (algorithm.go).
//  4. Its inline fields in protocol (algorithm.go: InlineShape and the
//     fields it accepts) and its policy fields in package policy
//     (Policy.Shape), each with their tests.
//  5. Its inline limits in inlineOf (algorithm_test.go), for the test that
//     every registered algorithm takes, peeks, takes beside another in a
//     take of several checks, settles or refuses to, and renders header
//     fields; and tests of its own against a real redis-server: its
//     scripts in luascript, its decisions here or through a sidecar in
//     package sidecar.
//  6. What its RateLimit header fields say (headers.go): without more, a
//     decision renders the generic parameters, q (the shape's Quota), r
//     (remaining) and t (reset_ms in seconds). An algorithm with a window
//     or a unit adds a headerItem(limits.Shape, *Outcome) headerItem
//     method that starts from genericItem and sets w, qu, or drops t;
//     fixedwindow's, tokenbucket's, concurrency's and slidingwindow's are
//     in headers.go.
//
// Batching, deadlines, the breaker, the local denial, shadow mode,
// on_unavailable, the metrics, the decision log and a take of several
// checks then work for it through the interface.
package dispatch
