package luascript

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"quotad/limits"
)

// MaxChecks bounds the checks of one take of several checks (limits.MaxChecks).
const MaxChecks = limits.MaxChecks

var (
	//go:embed take_checks_redis.lua
	takeChecksRedisSrc string
	//go:embed take_checks.lua
	takeChecksSrc string
	//go:embed give_back.lua
	giveBackSrc string

	takeChecks = newTakeChecks()
	giveBack   = newGiveBack()
)

// newChecksScript is a script of the take of several limits: the prelude,
// then, after the line naming it, its body, which starts with MAX_CHECKS
// and BODIES (bodiesLua). Like every script's, its body is whole after
// that line, so that its batch script (batch.go) can run it as a function.
func newChecksScript(name, body string) *script {
	body = "local MAX_CHECKS = " + strconv.Itoa(MaxChecks) + "\n" + body
	src := prelude + "\n-- " + name + "\n" + body
	return &script{name: name, body: body, src: src, sha: sha1Hex(src), lua: rueidis.NewLuaScript(src)}
}

// takeBody is a take that a take of several limits can run: fn, its
// function's name in take_checks.lua's script; give, the function of
// give_back.lua that gives back what it took. Where its
// arguments are (its request_id among them) follows from its contract.
type takeBody struct {
	s        *script
	c        *contract
	fn, give string
}

// takeBodies are the takes a take of several limits can run, joined into
// its script as they are.
var takeBodies = []takeBody{
	{fixedWindowTake, &fixedWindowTakeContract, "fixed_window_take", "give_fixed_window"},
	{tokenBucketTake, &tokenBucketTakeContract, "token_bucket_take", "give_token_bucket"},
	{concurrencyTake, &concurrencyTakeContract, "concurrency_take", "give_concurrency"},
	{slidingWindowTake, &slidingWindowTakeContract, "sliding_window_take", "give_sliding_window"},
	{calendarTake, &calendarTakeContract, "calendar_take", "give_calendar"},
}

// bodiesLua declares BODIES: each take by its name, with the place of
// each of its arguments (at, from its contract), and with fn its function
// when withFn.
func bodiesLua(withFn bool) string {
	var b strings.Builder
	b.WriteString("local BODIES = {\n")
	for _, mb := range takeBodies {
		b.WriteString("  " + mb.fn + " = {name = '" + mb.fn + "', ")
		if withFn {
			b.WriteString("fn = " + mb.fn + ", ")
		}
		b.WriteString("at = {")
		for i, a := range mb.c.argv() {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(a.name + " = " + strconv.Itoa(i+1))
		}
		b.WriteString("}},\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// newTakeChecks makes take_checks.lua's script: the prelude, as every
// script's, then its body (newChecksScript): the redis its take bodies see
// (take_checks_redis.lua), the prelude's helpers again, now bound to that
// redis, each take body as a local function, BODIES naming them, then
// take_checks.lua. Each take body stays the text of its own script, so a
// single take and a check of a take of several checks decide alike.
func newTakeChecks() *script {
	var b strings.Builder
	b.WriteString("\n-- take_checks_redis.lua\n" + takeChecksRedisSrc)
	b.WriteString("\n" + preludeSrc)
	for _, mb := range takeBodies {
		body := mb.s.body
		if strings.HasPrefix(body, "#!") {
			_, body, _ = strings.Cut(body, "\n")
		}
		b.WriteString("\n-- " + mb.s.name + "\nlocal function " + mb.fn + "(KEYS, ARGV)\n" + body + "\nend\n")
	}
	b.WriteString("\n" + bodiesLua(true))
	b.WriteString("\n-- the checks\n" + assemble("take_checks.lua", takeChecksSrc, nil))
	return newChecksScript("take_checks.lua", b.String())
}

// newGiveBack makes give_back.lua's script: BODIES, then
// the file, whose line --#give becomes GIVE, each take's give back by its
// name.
func newGiveBack() *script {
	give := "local GIVE = {\n"
	for _, mb := range takeBodies {
		give += "  " + mb.fn + " = " + mb.give + ",\n"
	}
	give += "}\n"
	body := strings.Replace(assemble("give_back.lua", giveBackSrc, nil), "--#give\n", give, 1)
	return newChecksScript("give_back.lua", bodiesLua(false)+"\n"+body)
}

func takeBodyOf(s *script) (takeBody, bool) {
	for _, mb := range takeBodies {
		if mb.s == s {
			return mb, true
		}
	}
	return takeBody{}, false
}

// TakeCheck is one check of a take of several checks.
type TakeCheck struct {
	// Call is the check's take, built by TakeCall with the take's
	// request id.
	Call Call
	// Shadow: the check's denial does not deny the take; it consumes when
	// it accepts and the take does.
	Shadow bool
}

// TakeChecksCall builds the one script call that takes every check or none
// (take_checks.lua). requestID is the take's, "" for none; digest is
// ChecksDigest of the set of checks, "" without a request id. Two checks
// on one key are INVALID.
func TakeChecksCall(checks []TakeCheck, requestID, digest string) (Call, error) {
	return checksCall(takeChecks, checks, requestID, digest)
}

// GiveBackCall builds the call that gives back what checks, all in
// one hash slot, consumed in an accepted step of a take of several limits
// under requestID (required) and digest: the rollback of that step when a
// later one denies or fails (give_back.lua). Giving back twice
// gives back once.
func GiveBackCall(checks []TakeCheck, requestID, digest string) (Call, error) {
	if requestID == "" {
		return Call{}, &Error{Code: CodeInvalid, Message: "request_id is required"}
	}
	return checksCall(giveBack, checks, requestID, digest)
}

// ParseGiveBack reads which of n checks were given back.
func ParseGiveBack(res rueidis.RedisResult, n int) ([]bool, error) {
	const op = "give back"
	if err := res.Error(); err != nil {
		return nil, replyError(op, err)
	}
	v := make([]int64, n)
	if err := ints(op, res, v, 0); err != nil {
		return nil, err
	}
	out := make([]bool, n)
	for i, x := range v {
		if !isFlag(x) {
			return nil, malformed(op, "reply %v", v)
		}
		out[i] = x == 1
	}
	return out, nil
}

func checksCall(s *script, checks []TakeCheck, requestID, digest string) (Call, error) {
	if len(checks) < 1 || len(checks) > MaxChecks {
		return Call{}, &Error{Code: CodeInvalid, Message: "a take has 1 to " + strconv.Itoa(MaxChecks) + " checks"}
	}
	if err := checkRequestID(requestID, false); err != nil {
		return Call{}, err
	}
	if (requestID == "") != (digest == "") || digest != "" && !isDigest(digest) {
		return Call{}, &Error{Code: CodeInvalid, Message: "digest must be 16 hex digits with a request id, empty without"}
	}
	nk, na := 0, 3
	for _, c := range checks {
		nk, na = nk+len(c.Call.keys), na+4+len(c.Call.args)
	}
	keys := make([]string, 0, nk)
	args := append(make([]string, 0, na), strconv.Itoa(len(checks)), requestID, digest)
	for i, c := range checks {
		mb, ok := takeBodyOf(c.Call.s)
		if !ok {
			return Call{}, &Error{Code: CodeInvalid, Message: "check " + strconv.Itoa(i+1) + ": a check is a take"}
		}
		if id := mb.c.index("id"); len(c.Call.args) < id || c.Call.args[id-1] != requestID {
			return Call{}, &Error{Code: CodeInvalid, Message: "check " + strconv.Itoa(i+1) + ": its request_id is not the take's"}
		}
		// A take has few keys: a scan of those before is cheaper than a
		// map.
		for _, k := range c.Call.keys {
			if j := slices.Index(keys, k); j >= 0 {
				return Call{}, &Error{Code: CodeInvalid, Message: "checks " + strconv.Itoa(ownerOf(checks, j)+1) + " and " + strconv.Itoa(i+1) +
					" count against the same limit and subject: give each once"}
			}
		}
		args = append(args, mb.fn, flag(c.Shadow), strconv.Itoa(len(c.Call.keys)), strconv.Itoa(len(c.Call.args)))
		args = append(args, c.Call.args...)
		keys = append(keys, c.Call.keys...)
	}
	return Call{s: s, keys: keys, args: args}, nil
}

// ownerOf is the index of the check of checks whose keys, listed one check
// after another, hold the key at index k.
func ownerOf(checks []TakeCheck, k int) int {
	for i, c := range checks {
		if k < len(c.Call.keys) {
			return i
		}
		k -= len(c.Call.keys)
	}
	return -1
}

// ChecksDigest names a set of checks and their costs, whatever their
// order: each part says one check (its key and cost, say), and the digest
// is the first 16 hex digits of the SHA1 of the sorted parts. Each check's
// request-id record keeps it, so that a take of another set under the same
// request id is CONFLICT.
func ChecksDigest(parts []string) string {
	s := slices.Clone(parts)
	slices.Sort(s)
	sum := sha1.Sum([]byte(strings.Join(s, "\n")))
	return hex.EncodeToString(sum[:8])
}

func isDigest(s string) bool {
	if len(s) != 16 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ChecksResult is a take of several checks's answer.
type ChecksResult struct {
	// Applied: every check consumed (or replayed); false when nothing was
	// written, because a check that is not a shadow one denied.
	Applied bool
	// Checks are each check's reply, in order, for ParseTake. When
	// Applied is false
	// each is what the check would have answered alone: one that accepted
	// reports the use it would have had after consuming.
	Checks []rueidis.RedisResult
}

// ParseTakeChecks reads the result of a take of several checks of n checks. A
// refusal is an *Error whose message names the check ("check 2: ...");
// nothing was written.
func ParseTakeChecks(res rueidis.RedisResult, n int) (ChecksResult, error) {
	const op = "take of checks"
	if err := res.Error(); err != nil {
		return ChecksResult{}, replyError(op, err)
	}
	arr, err := res.ToArray()
	if err != nil {
		return ChecksResult{}, malformed(op, "%v", err)
	}
	if len(arr) != n+1 {
		return ChecksResult{}, malformed(op, "want %d values, got %d", n+1, len(arr))
	}
	applied, err := arr[0].ToInt64()
	if err != nil || !isFlag(applied) {
		return ChecksResult{}, malformed(op, "applied %v (%v)", applied, err)
	}
	r := ChecksResult{Applied: applied == 1, Checks: make([]rueidis.RedisResult, n)}
	for i := range n {
		r.Checks[i] = rueidis.NewResult(arr[i+1], nil)
	}
	return r, nil
}

// ExecOnOneNode sends a take of several checks whose keys are in several hash
// slots to the node of its first key, as one EVALSHA (EVAL on NOSCRIPT)
// that declares every key. A routing client (a Cluster's) refuses to
// build such a command with Exec; a store that is one node holding every
// slot (the embedded one) runs it whole. A Redis Cluster answers it
// CROSSSLOT and runs nothing.
func (c Call) ExecOnOneNode(ctx context.Context, client rueidis.Client) rueidis.RedisResult {
	if c.s == nil || len(c.keys) == 0 {
		return rueidis.NewErrorResult(errZeroCall)
	}
	rest := append(slices.Clone(c.keys[1:]), c.args...)
	n := int64(len(c.keys))
	res := client.Do(ctx, client.B().Evalsha().Sha1(c.s.sha).Numkeys(n).Key(c.keys[0]).Arg(rest...).Build())
	if re, ok := rueidis.IsRedisErr(res.Error()); ok && re.IsNoScript() {
		res = client.Do(ctx, client.B().Eval().Script(c.s.src).Numkeys(n).Key(c.keys[0]).Arg(rest...).Build())
	}
	return res
}
