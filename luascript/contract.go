package luascript

import (
	"fmt"
	"strconv"
	"strings"
)

// A contract is what a script takes: how many keys, and its arguments in
// ARGV order, each with its kind and bounds. It is written once, here, and
// the rest follows from it: the Lua that checks the arguments (checksLua,
// spliced into the script where its body says --#args), the Go that lays
// them out (the builders write each from its field of Args, Args.text),
// and where a take of several limits finds a take's arguments
// (takechecks.go).
type contract struct {
	keys int
	args []arg
	// fast says how a take checks every argument at once, before the
	// checks one by one: by num, which pays in a batch, whose decisions
	// share num's values (a take's policy is repeated from call to call),
	// or by one match of the arguments joined by ':' (none can hold one)
	// when a take has more numbers than a batch shares (a calendar's
	// edges). Peeks and settles, rarely batched with their like, go one by
	// one: a lone call pays num's table for nothing.
	fast fastCheck
}

type fastCheck int

const (
	oneByOne fastCheck = iota
	byNum
	byMatch
)

type argKind int

const (
	argNum        argKind = iota // a canonical decimal in lo..hi
	argStrict                    // "0" or "1"
	argID                        // a request id, or "" for none
	argIDRequired                // a request id
	argText                      // any text; a rule after it checks it
	argRule                      // no argument: a condition on those before it
)

// arg is one argument of a contract, or a rule between them. A number's
// text is the Lua local name_s and its value name; any other argument's
// text is name.
type arg struct {
	kind   argKind
	name   string
	lo, hi string // a number's bounds, Lua expressions
	// msg is the INVALID message, a Lua expression; a number's defaults
	// to "<label> must be a decimal in <lo>..<hi>".
	msg   string
	label string
	cond  string // a rule's condition, a Lua expression
}

func num(name, label, lo, hi string) arg {
	return arg{kind: argNum, name: name, label: label, lo: lo, hi: hi}
}

func rule(cond, msg string) arg { return arg{kind: argRule, cond: cond, msg: msg} }

var (
	strictArg  = arg{kind: argStrict, name: "strict"}
	idArg      = arg{kind: argID, name: "id"}
	idRequired = arg{kind: argIDRequired, name: "id"}
	limitArg   = num("limit", "limit", "1", "MAX_LIMIT")
	windowArg  = num("window", "window_ms", "1", "MAX_WINDOW_MS")
	maxIDsArg  = num("maxids", "max request ids", "1", "MAX_REQUEST_IDS")
	dedupeArg  = num("dedupe", "dedupe_ms", "1", "MAX_WINDOW_MS")
	settleCost = num("cost", "cost", "0", "MAX_LIMIT")
	bucketArgs = []arg{
		num("rate", "rate", "1", "MAX_LIMIT"),
		num("period", "period_ms", "1", "MAX_WINDOW_MS"),
		num("burst", "burst", "1", "MAX_LIMIT"),
		// The refill time from empty bounds every time the bucket stores.
		rule("burst * period <= MAX_WINDOW_MS * rate", "'burst * period_ms / rate must be at most ' .. MAX_WINDOW_MS"),
	}
	leaseArgs = []arg{num("limit", "limit", "1", "MAX_LEASES"), num("lease", "lease_ms", "1", "MAX_WINDOW_MS")}
	// A calendar window's spec, then the edges of its three periods.
	calendarArgs = []arg{
		{kind: argText, name: "spec"},
		rule(`#spec <= 128 and string.sub(spec, 1, #limit_s + 1) == limit_s .. ':'
    and string.match(spec, '^[0-9]+:[a-z0-9]+:[A-Za-z0-9_/+%-]+:[a-z-]+:[0-9]+$')`,
			"'spec must be limit:period:zone:week_start:jitter_ms'"),
		edge("e1"), edge("e2"), edge("e3"), edge("e4"),
		rule(`e1 < e2 and e2 < e3 and e3 < e4 and e2 - e1 <= MAX_PERIOD_MS and e3 - e2 <= MAX_PERIOD_MS
    and e4 - e3 <= MAX_PERIOD_MS`, edgesMsg),
	}
)

const edgesMsg = "'edges must be 4 increasing decimals, at most ' .. MAX_PERIOD_MS .. ' ms apart'"

func edge(name string) arg {
	a := num(name, "", "0", "MAX_EXACT")
	a.msg = edgesMsg
	return a
}

func argList(parts ...any) []arg {
	var out []arg
	for _, p := range parts {
		switch p := p.(type) {
		case arg:
			out = append(out, p)
		case []arg:
			out = append(out, p...)
		}
	}
	return out
}

// The contracts of the scripts of one key and of a calendar's three.
var (
	fixedWindowTakeContract   = contract{1, argList(limitArg, windowArg, num("cost", "cost", "1", "limit"), maxIDsArg, strictArg, idArg), byNum}
	fixedWindowPeekContract   = contract{1, argList(limitArg, windowArg, strictArg), oneByOne}
	fixedWindowSettleContract = contract{1, argList(limitArg, windowArg, settleCost, strictArg, idRequired), oneByOne}

	tokenBucketTakeContract   = contract{1, argList(bucketArgs, num("cost", "cost", "1", "burst"), dedupeArg, maxIDsArg, strictArg, idArg), byNum}
	tokenBucketPeekContract   = contract{1, argList(bucketArgs, strictArg), oneByOne}
	tokenBucketSettleContract = contract{1, argList(bucketArgs, settleCost, dedupeArg, strictArg, idRequired), oneByOne}

	concurrencyTakeContract    = contract{1, argList(leaseArgs, strictArg, idRequired), byNum}
	concurrencyPeekContract    = contract{1, argList(leaseArgs, strictArg), oneByOne}
	concurrencyReleaseContract = contract{1, argList(idRequired), oneByOne}

	slidingWindowTakeContract   = fixedWindowTakeContract
	slidingWindowPeekContract   = fixedWindowPeekContract
	slidingWindowSettleContract = fixedWindowSettleContract

	calendarTakeContract   = contract{3, argList(limitArg, num("cost", "cost", "1", "limit"), maxIDsArg, strictArg, idArg, calendarArgs), byMatch}
	calendarPeekContract   = contract{3, argList(limitArg, strictArg, calendarArgs), oneByOne}
	calendarSettleContract = contract{3, argList(limitArg, settleCost, strictArg, idRequired, calendarArgs), oneByOne}
	calendarGiveContract   = contract{3, argList(limitArg, num("cost", "cost", "1", "MAX_LIMIT"), strictArg, calendarArgs), oneByOne}
)

// The contracts of a reservation and its return (docs/allotments.md): a
// reservation takes between cost and want units, at most share (in parts
// of SHARE_SCALE) of what is left, recorded under its holder (the id
// argument) and seq with the kept units of its earlier one; a return
// gives back cost units of the holder's reservation seq. Only named policies have allotments: no strict.
var (
	wantArgs = []arg{
		num("want", "want", "1", "limit"),
		rule("want >= cost", "'want must be at least cost'"),
		num("share", "max share", "1", "SHARE_SCALE"),
	}
	bucketWantArgs = []arg{
		num("want", "want", "1", "burst"),
		rule("want >= cost", "'want must be at least cost'"),
		num("share", "max share", "1", "SHARE_SCALE"),
	}
	seqArg  = num("seq", "seq", "1", "MAX_EXACT")
	keptArg = num("kept", "kept", "0", "MAX_LIMIT")

	fixedWindowReserveContract   = contract{1, argList(limitArg, windowArg, num("cost", "cost", "1", "limit"), wantArgs, idRequired, seqArg, keptArg), oneByOne}
	slidingWindowReserveContract = fixedWindowReserveContract
	calendarReserveContract      = contract{3, argList(limitArg, num("cost", "cost", "1", "limit"), wantArgs, idRequired, seqArg, keptArg, calendarArgs), oneByOne}
	tokenBucketReserveContract   = contract{1, argList(bucketArgs, num("cost", "cost", "1", "burst"), bucketWantArgs, dedupeArg, idRequired, seqArg, keptArg), oneByOne}
	windowReturnContract         = contract{1, argList(settleCost, idRequired, seqArg), oneByOne}
	slidingWindowReturnContract  = windowReturnContract
	tokenBucketReturnContract    = contract{1, argList(bucketArgs, settleCost, idRequired, seqArg), oneByOne}
)

// argv are the contract's arguments in ARGV order: all but its rules.
func (c contract) argv() []arg {
	out := make([]arg, 0, len(c.args))
	for _, a := range c.args {
		if a.kind != argRule {
			out = append(out, a)
		}
	}
	return out
}

// index is the place (from 1) in ARGV of the argument named name, or 0.
func (c contract) index(name string) int {
	for i, a := range c.argv() {
		if a.name == name {
			return i + 1
		}
	}
	return 0
}

func (a arg) text() string {
	if a.kind == argNum {
		return a.name + "_s"
	}
	return a.name
}

func (a arg) message() string {
	switch {
	case a.msg != "":
		return a.msg
	case a.kind == argStrict:
		return "'strict must be 0 or 1'"
	case a.kind == argID || a.kind == argIDRequired:
		return "REQUEST_ID_RULE"
	case a.hi == strings.ToUpper(a.hi):
		return "'" + a.label + " must be a decimal in " + a.lo + "..' .. " + a.hi
	}
	return "'" + a.label + " must be a decimal in " + a.lo + ".." + a.hi + "'"
}

// fast is the condition, over the values num read, under which the
// argument is valid; check is the Lua that refuses it when it is not.
func (a arg) fast() string {
	switch a.kind {
	case argNum:
		return a.name + " <= " + a.hi
	case argStrict:
		return "(strict == '0' or strict == '1')"
	case argID:
		return "(id == '' or #id <= MAX_REQUEST_ID_BYTES and string.find(id, REQUEST_ID))"
	case argIDRequired:
		return "#id <= MAX_REQUEST_ID_BYTES and string.find(id, REQUEST_ID)"
	case argRule:
		return "(" + a.cond + ")"
	}
	return ""
}

// pattern is the argument's part of the match of every argument at once,
// "" for one left out of it (a text, checked by its rule).
func (a arg) pattern() string {
	switch a.kind {
	case argNum:
		return "[1-9]%d*"
	case argStrict:
		return "[01]"
	case argID:
		return "[A-Za-z0-9_%-]*"
	case argIDRequired:
		return "[A-Za-z0-9_%-]+"
	}
	return ""
}

func (a arg) check(in string) string {
	var bad string
	switch a.kind {
	case argNum:
		return in + a.name + " = dec(" + a.name + "_s, " + a.lo + ", " + a.hi + ")\n" + in + "if not " + a.name + " then\n" +
			in + "  return fail('INVALID', " + a.message() + ")\n" + in + "end\n"
	case argStrict:
		bad = "strict ~= '0' and strict ~= '1'"
	case argID:
		bad = "id ~= '' and (#id > MAX_REQUEST_ID_BYTES or not string.find(id, REQUEST_ID))"
	case argIDRequired:
		bad = "id == '' or #id > MAX_REQUEST_ID_BYTES or not string.find(id, REQUEST_ID)"
	case argRule:
		bad = "not (" + a.cond + ")"
	default:
		return ""
	}
	return in + "if " + bad + " then\n" + in + "  return fail('INVALID', " + a.message() + ")\n" + in + "end\n"
}

func plural(n int, one string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + one + "s"
}

// checksLua is the Lua that reads and checks the contract's arguments,
// before the script touches Redis: key (for a script of one key), each
// argument's text and each number's value as locals. Every argument at
// once first, the usual case: each number by num, then their bounds and
// the rest in one condition. Any other arguments go through the checks one
// by one, in order, which say what is wrong; both accept exactly the same
// arguments, since both are written from the same list here. A canonical
// decimal in bounds has at most 16 digits, so each value is exact.
func (c contract) checksLua() string {
	var b strings.Builder
	argv := c.argv()
	docs := make([]string, len(argv))
	for i, a := range argv {
		docs[i] = a.doc()
	}
	b.WriteString("-- ARGV, from the script's contract (contract.go): " + strings.Join(docs, ", ") + "\n")
	fmt.Fprintf(&b, "if #KEYS ~= %d or #ARGV ~= %d then\n  return fail('INVALID', 'want %s and %s')\nend\n",
		c.keys, len(argv), plural(c.keys, "key"), plural(len(argv), "argument"))
	if c.keys == 1 {
		b.WriteString("local key = KEYS[1]\n")
	}
	names, reads := make([]string, len(argv)), make([]string, len(argv))
	var nums, vals []string
	for i, a := range argv {
		names[i], reads[i] = a.text(), "ARGV["+strconv.Itoa(i+1)+"]"
		if a.kind == argNum {
			nums = append(nums, a.name)
			vals = append(vals, "num("+a.name+"_s)")
		}
	}
	fmt.Fprintf(&b, "local %s = %s\n", strings.Join(names, ", "), strings.Join(reads, ", "))
	if c.fast == oneByOne {
		if len(nums) > 0 {
			b.WriteString("local " + strings.Join(nums, ", ") + "\n")
		}
		for _, a := range c.args {
			b.WriteString(a.check(""))
		}
		return b.String()
	}
	conds := []string{}
	if c.fast == byNum {
		fmt.Fprintf(&b, "local %s = %s\n", strings.Join(nums, ", "), strings.Join(vals, ", "))
		conds = append(conds, nums...)
		for _, a := range c.args {
			if f := a.fast(); f != "" {
				conds = append(conds, f)
			}
		}
	} else {
		var joined, pat []string
		for _, a := range argv {
			if p := a.pattern(); p != "" {
				joined, pat = append(joined, a.text()), append(pat, p)
			}
		}
		b.WriteString("local " + strings.Join(nums, ", ") + "\n")
		fmt.Fprintf(&b, "if string.find(%s,\n    '^%s$') then\n", strings.Join(joined, " .. ':' .. "), strings.Join(pat, ":"))
		for _, n := range nums {
			fmt.Fprintf(&b, "  %s = %s_s + 0\n", n, n)
		}
		b.WriteString("end\n")
		conds = append(conds, nums[0])
		for _, a := range c.args {
			switch a.kind {
			case argNum, argRule:
				conds = append(conds, a.fast())
			case argID, argIDRequired:
				conds = append(conds, "#id <= MAX_REQUEST_ID_BYTES")
			}
		}
	}
	b.WriteString("-- Every argument at once, else one by one:\nif not (" + wrap(conds) + ") then\n")
	for _, a := range c.args {
		b.WriteString(a.check("  "))
	}
	b.WriteString("end\n")
	return b.String()
}

// wrap joins conds with "and", a few to a line.
func wrap(conds []string) string {
	var b strings.Builder
	line := 0
	for i, c := range conds {
		if i > 0 {
			if line+len(c) > 90 {
				b.WriteString("\n    and ")
				line = 8
			} else {
				b.WriteString(" and ")
			}
		}
		b.WriteString(c)
		line += len(c) + 5
	}
	return b.String()
}

// doc names the argument in the script's text.
func (a arg) doc() string {
	switch {
	case a.kind == argID || a.kind == argIDRequired:
		return "request_id"
	case a.label != "":
		return a.label
	}
	return a.name
}
