// Package luascript holds quotad's embedded Lua scripts and the typed Go calls
// over them. Each decision is decided inside one script call, alone or in
// a batch (below), so it is atomic on a single Redis and in a Redis
// Cluster (all its keys share a hash tag, see key.go).
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
// ids, qh and qt absent read as 0: a take writes only the fields it
// changes, so a bucket that never recorded a request id holds tat, rem and
// policy alone. A token lasts period/rate; the bucket is full when tat <= now. A take of
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
// # Sliding window
//
// A sliding window is a Redis hash at SlidingWindowKey, counting the two
// fixed periods of window_ms, aligned to Redis's clock (TIME), that any
// window-long interval ending now overlaps:
//
//	s             start of the current period, ms of Redis's clock
//	c             units accepted in the period starting at s
//	p             units accepted in the period before it
//	policy        "<limit>:<window_ms>" it was last written under
//	ids           number of r:* records
//	qh, qt        head and tail of the queue of records, in order of expiry
//	q:<n>         "<id>:<expiry ms>", one per recorded acceptance
//	r:<id>        "<cost>:<used right after acceptance>:<expiry ms>"
//
// The estimate of the use in the last window_ms, elapsed ms into the
// current period, is p * (window_ms - elapsed) / window_ms + c, and a take
// of cost is accepted iff estimate + cost <= limit; the arithmetic (the
// prelude's sliding_window) is exact in integers. A take counts until the
// end of the period after its own, and so do its request id record and the
// key: two windows at most. Every accepted take forgets up to three expired
// records, as for the token bucket.
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
// # Settlements
//
// A settle names an accepted take by its key and request id and gives its
// actual cost (0..MAX_LIMIT): the state moves by the cost minus the cost
// the take's record holds, and a field of its own records the
// settlement; the take's record is never rewritten. Records may carry
// more ':'-separated fields after the ones listed above, which every
// script reads past and keeps.
//
//	s:<id>        fixed and calendar windows: "<cost settled>"
//	s:<id>        sliding window, token bucket: "<cost settled>:<expiry of
//	              the record it settles, ms>", so that one left by an
//	              earlier take of the same id is told apart
//	sh, st        sliding window, token bucket: head and tail of the queue
//	              of settlements, in order of settling
//	sq:<n>        "<id>:<expiry ms>", one per settlement
//
// A fixed or calendar window's used, or the sliding window's count of the
// period the take counted in (its record's expiry - 2 * window_ms), moves
// within 0..MAX_LIMIT; a bucket's TAT moves by the span of the difference,
// never below now (a full bucket) and never more than MAX_WINDOW_MS past
// now. A settle is never limited, never creates a key and never moves a
// window's end; a bucket's TTL only grows, to its new full time. Every
// sliding window and bucket settle forgets up to three settlements past
// their expiry, as takes forget records. A take the state no longer holds
// (the window ended, it slid out, the bucket's horizon passed) or never
// held is the no-op answer, settled 0.
//
// # Allotments
//
// A sidecar may reserve units of a window or bucket to hand out from
// memory (docs/allotments.md, allotment.go): a reservation
// (<algorithm>_reserve.lua) is one atomic take of between the take's
// cost and the units wanted, at most max_share of what is left, and a
// denial, writing nothing, when the cost does not fit. It records its
// holder, the sidecar, in one field of the hash:
//
//	a:<holder>    "<seq>:<units>", the holder's latest reservation and the
//	              units it may give back under it (a sliding window's adds
//	              ":<start of the period they count in, ms>")
//
// A return (window_return.lua for fixed and calendar windows, whose
// period key the caller names; sliding_window_return.lua,
// token_bucket_return.lua) names (holder, seq), gives back at most the
// record's units, and removes the record: a return sent again, or naming
// an earlier seq, applies nothing. A window's used falls by them; a
// sliding window's count of the period they counted in, while it counts;
// a bucket's TAT moves back by their span, never before now. A return
// never creates a key, never gives one a TTL, and writes nothing to a key
// without one. Reservations and returns are in no batch script (alone, in
// batch.go): each is sent as its own script call. Nor are they loaded
// when a sidecar connects (lazySources, load.go): a Loader loads each
// into a node when its first call there is answered NOSCRIPT.
//
// # Several limits in one take
//
// take_checks.lua takes the checks of one take all or nothing: its script is
// the prelude and every take body above, each unchanged as a local
// function, run twice (takechecks.go joins them at init). The first pass
// runs each check's body against a redis whose writes go nowhere
// (take_checks_redis.lua); when every check that is not a shadow one
// accepts, the second runs them again, for real. Both read one TIME, and
// no two checks share a key, so the second pass decides as the first; the
// script's header argues it per algorithm, and why a full Redis
// (maxmemory) leaves nothing half-written. Each check's record r:<id> gets
// two more fields, "m<digest>" of the take's set of checks (ChecksDigest)
// and a copy of its last field, so that a retry with another set or cost
// is CONFLICT while a single take's readers still read the leading fields
// and the last one:
//
//	fixed window, calendar   "<cost>:<used>:m<digest>:<used>"
//	token bucket             "<cost>:<remaining>:<expiry ms>:m<digest>:<expiry ms>"
//	sliding window           "<cost>:<used>:<expiry ms>:m<digest>:<expiry ms>"
//
// A concurrency check's record is its lease, which holds no digest. On a
// Redis Cluster the keys of one call must share a slot (keyslot.Of); a
// subject's own hash tag makes them (key.go). A take whose keys do not is
// taken a slot at a time by the dispatcher, and give_back.lua
// (GiveBackCall) gives back a slot's checks, found by their records,
// when a later slot denies.
//
// Peek scripts start with "#!lua flags=no-writes" (see scripts.go).
//
// # Calls
//
// Every script call is a Call, built and validated by the builder of its
// op, for any algorithm (its name in quotad/limits), from one Args, and
// read by the parser of its op into one Result:
//
//	take     TakeCall / ParseTake    {allowed, replay, used, remaining,
//	                                  reset_ms, retry_after_ms, healed}
//	                                  (an allowed take that healed nothing
//	                                  leaves out the last two)
//	peek     PeekCall / ParsePeek    {exists, used, remaining, reset_ms}
//	settle   SettleCall / ParseSettle {settled, replay, reserved, used,
//	                                  remaining, reset_ms, retry_after_ms,
//	                                  healed}
//	release  ReleaseCall / ParseRelease {released, used}
//	several limits  TakeChecksCall (of the takes' calls) / ParseTakeChecks,
//	                whose Checks ParseTake reads
//
// Every script of an op replies in its layout, so a take's replay flag is
// in one place whatever its algorithm. What each script takes is its
// contract (contract.go): its keys and its arguments, in order, with
// their kinds and bounds. The builders write ARGV from Args by the
// contract's names, and the scripts' argument checks are written from it
// too, so neither can drift from the other.
//
// Call.Exec sends one call; ExecMulti sends calls of any mix of scripts in
// one round trip, each its own script call, and returns their results in
// order; ExecBatch (what the dispatcher uses) sends them as batch script
// calls and returns the same results. Take, Peek, Settle and Release are
// a builder, Exec and a parser. Go validates against quotad/limits before
// anything is sent; a script refusal is an *Error with a stable Code.
//
// # Batches
//
// A batch script (batch.lua's driver, composed in batch.go) decides
// several calls of one algorithm in one script call: the prelude, the body
// of each of the algorithm's scripts (take, peek, settle or release),
// wrapped as a function of KEYS and ARGV (made when a decision of the call
// first needs it), and a driver that hands each decision its own keys and
// arguments and runs its body under pcall. There is one batch script per
// algorithm, and one for the take of several limits and its give back
// (batchFamilies), so that after Redis lost its scripts a batch has only
// its own algorithm's batch script loaded (about 27 to 40 KB, against
// about 660 KB for every script). A decision in a batch is the same code
// as alone and answers what its lone script would: its reply, or its
// error as its element of the batch's reply, the others untouched.
// ExecBatch groups calls by batch script and by Redis node (by hash slot
// on a Cluster, keyslot.Of), at most MaxBatch a call, so that a batch of
// several algorithms is a script call of each; it sends a group of one as
// its own script, sends every
// group in one DoMulti, resends a group once on NOSCRIPT (it ran nothing;
// through a Loader's client, as EVALSHA once the script is loaded, see
// loader.go) and never otherwise. Under maxmemory a decision's first write
// is refused only while no earlier decision of the call wrote, as its own
// OOM error; batch.lua has the argument. Every decision of a call reads
// the same instant of Redis's clock (redis_now), the clock Redis expires
// keys by during a script.
//
// # Adding a script
//
//  1. Write <name>.lua. A peek's first line is "#!lua flags=no-writes".
//     Where it reads its arguments, a line "--#args" is replaced by the
//     checks of its contract; a line "--#include <piece> k=v ..." by a
//     piece of pieces.lua, the Lua several scripts share (a window's TTL
//     heal, a calendar's period, the pruning of a queue of records...),
//     each ${k} by v: plain text, with no function call. The body may use
//     the prelude's helpers (prelude.lua), joined before it at init, and
//     must not define its own: dec (a canonical decimal in bounds), fail
//     (every error reply, with TTL_RESTORED when it healed), NOT_OURS (the
//     start of the scripts' own WRONGTYPE message), failed_read (the
//     WRONGTYPE guard: the reply to a failed redis.pcall read of the key),
//     REQUEST_ID (a request id's pattern), redis_now (Redis's clock in µs
//     and ms, read once a call), num (an argument's value, read once a
//     call), gcra and sliding_window (the token bucket's and the sliding
//     window's exact arithmetic, made once a call for each bucket shape or
//     window), and the constants scripts.go writes from quotad/limits:
//     MAX_LIMIT, MAX_WINDOW_MS, MAX_LEASES, MAX_REQUEST_ID_BYTES,
//     MAX_REQUEST_IDS, MAX_EXACT, MAX_PERIOD_MS and REQUEST_ID_RULE. A new
//     bound goes into quotad/limits and boundsLua, never into a script as
//     a literal. Redis makes every helper again on each run of every
//     script, so a helper earns its place in the prelude only if several
//     scripts need it, and refers to no local unless that pays (see the
//     top of prelude.lua); Lua several scripts share but that runs once a
//     decision goes into pieces.lua instead.
//  2. At its top, say in a comment where its first write is and why every
//     error reply precedes it (at most a restored TTL may come first), as
//     the other scripts do: callers treat an *Error as "nothing applied".
//     Check every argument before touching Redis; give every key it writes
//     a TTL. Reply in its op's layout (# Calls).
//  3. Declare its contract in contract.go (a field in algorithms.go
//     for an argument of a new name), embed it and register it with
//     newScript in algorithms.go, in its algorithm's entry of algorithms
//     (a new algorithm: a new entry, with the check of its limits).
//  4. Add it to scripts in load.go, so Load and Sources (readiness, the
//     ACL test) know it, and to its algorithm's entry of batchFamilies
//     (batch.go), so its algorithm's batch script carries it. A take script
//     also goes into takeBodies (takechecks.go), with its give back, a
//     function of give_back.lua that reads the take's arguments
//     by their names, so a take of several limits can run it and, on a
//     Redis Cluster, give it back; its reads must not depend on its own
//     writes (see take_checks.lua).
//  5. Test it against redis-server (redistest): its decisions; every
//     refusal in nowrite_test.go (the key is the same before and after);
//     its arguments EVALed directly, past Go's validation; the embedded
//     store (miniredis_algorithms_test.go); ExecMulti with the other
//     scripts (multi_test.go); its tests again inside a batch
//     (TestScriptTestsInsideABatch, batch_test.go) and its calls in
//     TestBatchAnswersAsEachCallAlone. A body runs inside the batch as a
//     function: it keeps no reference to its KEYS or ARGV, and makes its
//     deciding write first, so that under maxmemory it is refused whole or
//     decides whole (batch.lua). If it reads a hash an earlier release
//     wrote, keep that release's script in testdata/ and test both
//     directions (compat_test.go). A take checks every argument at once
//     before the checks one by one (its contract's fast); add its
//     arguments to TestFastArgumentChecksAgreeWithTheSlowOnes.
//
// # What this package must never do
//
// It never retries a take: after a lost reply only the caller knows whether
// a request id makes a second attempt safe. It never writes before validating
// every argument, never leaves a key without a TTL, and never imports the
// socket or protocol layers; it takes a rueidis.Client and arguments, and
// returns results or *Error.
package luascript
