package luascript

import (
	"context"
	_ "embed"
	"fmt"
	"quotad/keyslot"
	"strings"

	"github.com/redis/rueidis"
)

// MaxBatch bounds the decisions of one batch script call, so that one call
// holds Redis only briefly (make bench measures what a batch adds to the
// latency of Redis's other clients). ExecBatch splits larger groups.
const MaxBatch = 64

// maxCount bounds a decision's keys and arguments in a batch, and the
// number of bodies: the layout holds each in a byte (batch.lua). It bounds
// the arguments a batch sends once for its references too.
const maxCount = 255

// maxRefs bounds the references of a batch (one per argument of each of
// its decisions), which batch.lua reads in one string.byte: Lua refuses
// to return more than about 8,000 values at once. A batch with more sends
// its arguments in full.
const maxRefs = 4096

//go:embed batch.lua
var batchDriverSrc string

// batchDriver is batch.lua without its leading comment, which is for its
// readers: every batch script carries the driver, and is the shorter to
// load and to parse for it (the embedded store parses a script's text on
// every call).
var batchDriver = func() string {
	code := batchDriverSrc
	for strings.HasPrefix(code, "--") {
		_, code, _ = strings.Cut(code, "\n")
	}
	return strings.TrimLeft(code, "\n")
}()

// batch is one batch script (batch.lua): the scripts it decides, each by
// its body index in it.
type batch struct {
	*script
	index map[*script]byte
}

// batchFamilies are the scripts each batch script decides: an algorithm's
// (its take, peek, settle or release; a calendar's give back), and the take of several limits with
// its give back (its body holds the take bodies it runs: takechecks.go).
// A batch script holds only its own bodies, so that what crosses the link
// when a node lost its scripts (a restart, a failover, SCRIPT FLUSH) is the
// batch script the calls need, not every algorithm's.
var batchFamilies = []struct {
	name string
	ss   []*script
}{
	{"fixed_window", []*script{fixedWindowTake, fixedWindowPeek, fixedWindowSettle}},
	{"token_bucket", []*script{tokenBucketTake, tokenBucketPeek, tokenBucketSettle}},
	{"concurrency", []*script{concurrencyTake, concurrencyPeek, concurrencyRelease}},
	{"sliding_window", []*script{slidingWindowTake, slidingWindowPeek, slidingWindowSettle}},
	{"calendar", []*script{calendarTake, calendarPeek, calendarSettle, calendarGive}},
	{"take_checks", []*script{takeChecks, giveBack}},
}

// alone are the scripts no batch script carries: the reservations and
// returns of allotments (allotment.go), a few a second per hot key, each
// sent as its own script call. A batch script of them would only add to
// what a node that lost its scripts is sent.
var alone = []*script{fixedWindowReserve, calendarReserve, windowReturn, slidingWindowReserve, slidingWindowReturn,
	tokenBucketReserve, tokenBucketReturn}

// batches are the batch scripts, one a family; batchOf is the batch script
// that decides each script's calls. A script in none is sent alone.
var batches, batchOf = func() ([]*batch, map[*script]*batch) {
	var bs []*batch
	of := map[*script]*batch{}
	for _, f := range batchFamilies {
		b := newBatch("batch_"+f.name+".lua", f.ss)
		bs = append(bs, b)
		for s := range b.index {
			of[s] = b
		}
	}
	return bs, of
}()

// batchBody is a script's body as a function of KEYS and ARGV: the body
// file's top-level text, its flags line left out, so that each body stays
// written once. ok is false for a script whose text is not the prelude
// then its body (join): one composed otherwise needs more than the
// prelude, and is sent alone.
func batchBody(s *script) (fn string, ok bool) {
	head, body, ok := strings.Cut(s.src, "\n-- "+s.name+"\n")
	if strings.HasPrefix(head, "#!") {
		_, head, _ = strings.Cut(head, "\n")
	}
	if !ok || head != prelude {
		return "", false
	}
	return "function(KEYS, ARGV)\n" + body + "\nend", true
}

// newBatch composes the batch script name of the scripts of ss that are
// the prelude then a body: the prelude, BODY, which makes the function of
// each body when the driver first needs it, and the driver. Its index is
// each such script's body number.
func newBatch(name string, ss []*script) *batch {
	var b strings.Builder
	b.WriteString(prelude)
	b.WriteString("\n-- BODY(i) is the function of the i-th body (batch.go).\n")
	b.WriteString("local function BODY(i)\n")
	index := make(map[*script]byte, len(ss))
	for _, s := range ss {
		fn, ok := batchBody(s)
		if !ok {
			continue
		}
		if len(index) == maxCount {
			panic("luascript: more scripts than a batch layout can name")
		}
		n := len(index) + 1
		index[s] = byte(n)
		fmt.Fprintf(&b, "  if i == %d then\n    -- %s\n    return %s\n  end\n", n, s.name, fn)
	}
	b.WriteString("end\n")
	fmt.Fprintf(&b, "local NBODIES = %d\nlocal MAX_BATCH = %d\nlocal MAX_REFS = %d\n\n-- batch.lua (its file's top says what it reads and answers)\n", len(index), MaxBatch, maxRefs)
	b.WriteString(batchDriver)
	src := b.String()
	return &batch{&script{name: name, src: src, sha: sha1Hex(src), lua: rueidis.NewLuaScript(src)}, index}
}

// BatchTexts are the batch scripts' texts, as Redis holds them, by name
// ("batch_fixed_window.lua").
func BatchTexts() map[string]string {
	m := make(map[string]string, len(batches))
	for _, b := range batches {
		m[b.name] = b.src
	}
	return m
}

// ExecBatch sends calls of any mix of scripts and returns one result per
// call, in order, each the reply its call would get alone, for its parser.
//
// Calls of one algorithm (their batch script's: batchFamilies) bound for
// the same Redis (on a Cluster: the same hash slot) go as one EVALSHA of
// that batch script (batch.lua), which decides each in turn, at most
// MaxBatch per call; a batch of several algorithms is one such call of
// each. A call alone in its group goes as its own script (Exec's
// command), which Redis runs for less. All the commands go in one
// DoMulti. A batch Redis did not run because it does not hold its batch
// script (NOSCRIPT, after a restart, a failover or SCRIPT FLUSH) ran
// nothing: through a Loader's client (Loader.Client) that script is
// loaded on that node once, whatever the number of batches that found it
// missing, and the batch is sent again as EVALSHA, or answered
// ErrNotLoaded, not run, when its deadline does not allow it. Only when
// Redis refuses to load it (or without a Loader) is the batch sent once
// more with EVAL, carrying the whole text. Either way no decision runs
// twice. Any other failure
// of a batch call (a lost connection, a timeout) is every one of its
// calls' result: whether they ran is unknown, and none is resent.
func ExecBatch(ctx context.Context, client rueidis.Client, calls []Call) []rueidis.RedisResult {
	res := make([]rueidis.RedisResult, len(calls))
	groups := groupCalls(client.Mode() == rueidis.ClientModeCluster, calls)
	cmds := make(rueidis.Commands, 0, len(groups))
	for _, g := range groups {
		if len(g) == 1 {
			c := calls[g[0]]
			if c.s.peek {
				cmds = append(cmds, client.B().EvalshaRo().Sha1(c.s.sha).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build())
			} else {
				cmds = append(cmds, client.B().Evalsha().Sha1(c.s.sha).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build())
			}
			continue
		}
		keys, args := batchArgs(calls, g)
		cmds = append(cmds, client.B().Evalsha().Sha1(batchOf[calls[g[0]].s].sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	var sent []rueidis.RedisResult
	if len(cmds) > 0 {
		sent = client.DoMulti(ctx, cmds...)
	}
	var again []int // groups to send again with EVAL
	for n, g := range groups {
		r := sent[n]
		err := r.Error()
		if len(g) == 1 {
			c := calls[g[0]]
			if re, ok := rueidis.IsRedisErr(err); ok && re.IsNoScript() || c.s.peek && flagsRefused(err) {
				r = c.Exec(ctx, client)
			}
			res[g[0]] = r
			continue
		}
		if re, ok := rueidis.IsRedisErr(err); ok && re.IsNoScript() {
			again = append(again, n)
			continue
		}
		splitBatch(res, g, r)
	}
	if len(again) > 0 {
		cmds = cmds[:0]
		for _, n := range again {
			keys, args := batchArgs(calls, groups[n])
			cmds = append(cmds, client.B().Eval().Script(batchOf[calls[groups[n][0]].s].src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
		}
		for i, r := range client.DoMulti(ctx, cmds...) {
			splitBatch(res, groups[again[i]], r)
		}
	}
	for i, c := range calls {
		if c.s == nil {
			res[i] = rueidis.NewErrorResult(errZeroCall)
		}
	}
	return res
}

// groupCalls groups the indexes of calls into script calls: every call
// whose script a batch script decides, by that batch script and by Redis
// node (by hash slot on a Cluster), in order, at most MaxBatch a group; a
// call no batch can carry (a script in none, too many keys or arguments)
// is a group of its own. The zero Call is in no group.
func groupCalls(cluster bool, calls []Call) [][]int {
	type where struct {
		b    *batch
		slot uint16 // on a Cluster
	}
	var groups [][]int
	open := map[where]int{} // the group being filled of each batch script (and slot)
	for i, c := range calls {
		if c.s == nil {
			continue
		}
		b := batchOf[c.s]
		if b == nil || len(c.keys) > maxCount || len(c.args) > maxCount || len(c.keys) == 0 {
			groups = append(groups, []int{i})
			continue
		}
		w := where{b: b}
		if cluster {
			w.slot = keyslot.Of(c.keys[0])
		}
		if n, ok := open[w]; ok && len(groups[n]) < MaxBatch {
			groups[n] = append(groups[n], i)
			continue
		}
		open[w] = len(groups)
		groups = append(groups, make([]int, 1, min(MaxBatch, len(calls)-i)))
		groups[len(groups)-1][0] = i
	}
	return groups
}

// batchArgs lays out the calls of group g as the batch script's KEYS and
// ARGV (batch.lua): the layout, the references, and each argument once
// where a decision repeats the argument in the same place of the last
// decision of its script (the calls of one policy share all but their
// request ids). When the references would not fit (more than maxRefs, more
// than maxCount arguments to send), every decision's arguments go in full
// and the references are "".
func batchArgs(calls []Call, g []int) (keys, args []string) {
	nk, na := 0, 0
	for _, i := range g {
		nk += len(calls[i].keys)
		na += len(calls[i].args)
	}
	keys = make([]string, 0, nk)
	layout := make([]byte, 0, 3*len(g))
	for _, i := range g {
		c := calls[i]
		keys = append(keys, c.keys...)
		layout = append(layout, batchOf[c.s].index[c.s], byte(len(c.keys)), byte(len(c.args)))
	}
	if na <= maxRefs {
		if args, ok := refArgs(calls, g, na); ok {
			args[0] = string(layout)
			return keys, args
		}
	}
	args = make([]string, 2, 2+na)
	for _, i := range g {
		args = append(args, calls[i].args...)
	}
	args[0] = string(layout)
	return keys, args
}

// refArgs is batchArgs's ARGV with references, but for the layout, or
// false when more than maxCount arguments would be sent.
func refArgs(calls []Call, g []int, na int) ([]string, bool) {
	// For each body so far (a batch has few), its last decision: its call,
	// and where its references start.
	type decided struct {
		body byte
		call *Call
		at   int
	}
	var bodies [4]decided
	last := bodies[:0]
	// Room for a policy's arguments and one more per decision (its request
	// id), what a batch of one policy sends; a mixed batch grows it.
	args := make([]string, 2, 2+min(na, len(g)+16, maxCount))
	refs := make([]byte, 0, na)
	for _, i := range g {
		c := &calls[i]
		body := batchOf[c.s].index[c.s]
		var prev decided
		n := 0
		for ; n < len(last); n++ {
			if last[n].body == body {
				prev = last[n]
				break
			}
		}
		if n == len(last) {
			last = append(last, decided{body: body})
		}
		at := len(refs)
		for x, a := range c.args {
			if prev.call != nil && x < len(prev.call.args) && prev.call.args[x] == a {
				refs = append(refs, refs[prev.at+x])
				continue
			}
			if len(args)-2 == maxCount {
				return nil, false
			}
			args = append(args, a)
			refs = append(refs, byte(len(args)-2))
		}
		last[n] = decided{body, c, at}
	}
	args[1] = string(refs)
	return args, true
}

// splitBatch gives each call of group g its element of the batch's reply
// r, or r itself when Redis refused the whole call (an error reply, which
// ran nothing, or a failure after which the outcome is unknown). A reply of
// another shape than one element per call is malformed for every call.
func splitBatch(res []rueidis.RedisResult, g []int, r rueidis.RedisResult) {
	if r.Error() != nil {
		for _, i := range g {
			res[i] = r
		}
		return
	}
	arr, err := r.ToArray()
	if err == nil && len(arr) != len(g) {
		err = fmt.Errorf("%d elements for %d decisions", len(arr), len(g))
	}
	if err != nil {
		bad := rueidis.NewErrorResult(&Error{Code: CodeMalformedReply, Message: "batch reply: " + err.Error()})
		for _, i := range g {
			res[i] = bad
		}
		return
	}
	for k, i := range g {
		res[i] = rueidis.NewResult(arr[k], nil)
	}
}
