package luascript_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
)

const minute = 60_000 // ms; long enough that no test window ends by itself

func args(key string, limit, cost int64, id string) luascript.Args {
	return luascript.Args{Key: key, Limit: limit, WindowMS: minute, Cost: cost, RequestID: id, MaxRequestIDs: 100}
}

func TestTakeOpensWindowAtFirstAcceptance(t *testing.T) {
	e := setup(t)
	k := e.key("u")

	r := e.take(args(k, 5, 2, "req-1"))
	if !r.Allowed || r.Replay || r.Healed || r.Used != 2 || r.ResetMS != minute {
		t.Fatalf("first take = %+v, want allowed, used 2, reset %d", r, minute)
	}
	sameHash(t, "after first take", e.hash(k), map[string]string{
		"used": "2", "policy": "5:60000", "ids": "1", "r:req-1": "2:2",
	})
	if p := e.pttl(k); p <= 0 || p > minute {
		t.Fatalf("PTTL = %d, want in (0, %d]", p, minute)
	}

	before := e.pttl(k)
	r = e.take(args(k, 5, 1, ""))
	if !r.Allowed || r.Used != 3 || r.ResetMS > before {
		t.Fatalf("second take = %+v, want allowed, used 3, reset <= %d", r, before)
	}
	if p := e.pttl(k); p > before {
		t.Fatalf("PTTL grew from %d to %d: a later take extended the window", before, p)
	}
	sameHash(t, "after second take", e.hash(k), map[string]string{
		"used": "3", "policy": "5:60000", "ids": "1", "r:req-1": "2:2",
	})
}

func TestTakeAcceptsUpToLimitAndDenialWritesNothing(t *testing.T) {
	e := setup(t)
	k := e.key("u")

	for i, want := range []struct {
		cost    int64
		allowed bool
		used    int64
	}{
		{2, true, 2}, {2, true, 4}, {2, false, 4}, {1, true, 5}, {1, false, 5},
	} {
		r := e.take(args(k, 5, want.cost, ""))
		if r.Allowed != want.allowed || r.Used != want.used || r.Replay {
			t.Fatalf("take %d (cost %d) = %+v, want allowed=%v used=%d", i, want.cost, r, want.allowed, want.used)
		}
	}

	before, pttl := e.hash(k), e.pttl(k)
	r := e.take(args(k, 5, 1, "denied-id"))
	if r.Allowed || r.Used != 5 || r.ResetMS <= 0 || r.ResetMS > pttl {
		t.Fatalf("take over the limit = %+v, want denied, used 5, reset in (0, %d]", r, pttl)
	}
	sameHash(t, "after denial", e.hash(k), before)
	if p := e.pttl(k); p > pttl {
		t.Fatalf("PTTL grew from %d to %d on a denial", pttl, p)
	}
}

func TestConcurrentTakesNeverOverAdmit(t *testing.T) {
	e := setup(t)
	k := e.key("u")

	const n = 20
	var wg sync.WaitGroup
	results := make([]luascript.Result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = luascript.Take(t.Context(), e.c, limits.FixedWindow, args(k, 5, 1, ""))
		})
	}
	wg.Wait()
	allowed := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("take %d: %v", i, errs[i])
		}
		if results[i].Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("%d of %d takes allowed with limit 5", allowed, n)
	}
	if used := e.hash(k)["used"]; used != "5" {
		t.Fatalf("used = %q, want 5", used)
	}
}

func TestReplayConsumesNothingAndKeepsTTL(t *testing.T) {
	e := setup(t)
	k := e.key("u")

	e.take(args(k, 10, 3, "a"))
	e.take(args(k, 10, 2, "")) // used moves on after a's acceptance

	before, pttl := e.hash(k), e.pttl(k)
	r := e.take(args(k, 10, 3, "a"))
	if !r.Allowed || !r.Replay || r.Used != 3 || r.ResetMS > pttl {
		t.Fatalf("replay = %+v, want allowed replay with used 3 (at acceptance), reset <= %d", r, pttl)
	}
	sameHash(t, "after replay", e.hash(k), before)
	if p := e.pttl(k); p > pttl {
		t.Fatalf("PTTL grew from %d to %d on a replay", pttl, p)
	}

	// A replay is answered even when the window is now full.
	e.take(args(k, 10, 5, ""))
	if r := e.take(args(k, 10, 3, "a")); !r.Allowed || !r.Replay || r.Used != 3 {
		t.Fatalf("replay in a full window = %+v, want allowed replay with used 3", r)
	}
}

func TestSameRequestIDOtherCostIsConflict(t *testing.T) {
	e := setup(t)
	k := e.key("u")

	e.take(args(k, 10, 3, "a"))
	before := e.hash(k)
	e.takeErr(args(k, 10, 4, "a"), luascript.ErrConflict)
	sameHash(t, "after conflict", e.hash(k), before)
}

func TestStrictPolicyMismatch(t *testing.T) {
	e := setup(t)
	k := luascript.FixedWindowKey(e.prefix, "", "u")
	a := args(k, 5, 1, "")
	a.Strict = true
	e.take(a)
	before := e.hash(k)

	other := a
	other.Limit = 6
	e.takeErr(other, luascript.ErrPolicy)
	other = a
	other.WindowMS = minute + 1
	e.takeErr(other, luascript.ErrPolicy)
	sameHash(t, "after policy mismatch", e.hash(k), before)

	if r := e.take(a); !r.Allowed || r.Used != 2 {
		t.Fatalf("take with the window's own policy = %+v, want allowed, used 2", r)
	}

	// The mismatch would repeat forever on a window without TTL, so the
	// refusal still restores one.
	e.mustDo("PERSIST", k)
	other = a
	other.Limit = 6
	e.takeErr(other, luascript.ErrPolicy)
	if p := e.pttl(k); p <= 0 {
		t.Fatalf("PTTL after POLICY on a window without TTL = %d, want restored", p)
	}
}

func TestNamedPolicyChangeAppliesToLiveWindow(t *testing.T) {
	e := setup(t)
	k := e.key("u")

	e.take(args(k, 10, 4, ""))
	pttl := e.pttl(k)

	// Lowered below the recorded use: denied, and nothing is written, so
	// the stored policy stays the old one.
	if r := e.take(args(k, 3, 1, "")); r.Allowed || r.Used != 4 {
		t.Fatalf("take after lowering the limit to 3 = %+v, want denied, used 4", r)
	}
	if got := e.hash(k)["policy"]; got != "10:60000" {
		t.Fatalf("policy after a denial = %q, want unchanged 10:60000", got)
	}

	// Raised, with a longer window: the limit counts against the recorded
	// use at once, and the window keeps its end.
	raised := args(k, 20, 10, "")
	raised.WindowMS = 10 * minute
	r := e.take(raised)
	if !r.Allowed || r.Used != 14 || r.ResetMS > pttl {
		t.Fatalf("take after raising the limit = %+v, want allowed, used 14, reset <= %d", r, pttl)
	}
	if p := e.pttl(k); p > pttl {
		t.Fatalf("PTTL grew from %d to %d after a policy change", pttl, p)
	}
	if got := e.hash(k)["policy"]; got != "20:600000" {
		t.Fatalf("policy after an accepted take = %q, want 20:600000", got)
	}
}

func TestWindowReopensAfterExpiry(t *testing.T) {
	e := setup(t)
	k := e.key("u")
	short := func(cost int64, id string) luascript.Args {
		a := args(k, 2, cost, id)
		a.WindowMS = 300
		return a
	}

	e.take(short(2, "a"))
	if r := e.take(short(1, "b")); r.Allowed {
		t.Fatalf("take in a full window = %+v, want denied", r)
	}
	if _, ok := e.hash(k)["r:b"]; ok {
		t.Fatal("a denied request id was recorded")
	}

	e.waitGone(k)

	if r := e.take(short(1, "b")); !r.Allowed || r.Replay || r.Used != 1 || r.ResetMS != 300 {
		t.Fatalf("denied id in the next window = %+v, want a new acceptance, used 1, reset 300", r)
	}
	if r := e.take(short(1, "a")); !r.Allowed || r.Replay || r.Used != 2 {
		t.Fatalf("id from the previous window = %+v, want a new acceptance, used 2", r)
	}
}

func TestRequestIDCap(t *testing.T) {
	e := setup(t)
	k := e.key("u")
	capped := func(cost int64, id string) luascript.Args {
		a := args(k, 10, cost, id)
		a.MaxRequestIDs = 2
		return a
	}

	e.take(capped(1, "a"))
	e.take(capped(1, "b"))
	before := e.hash(k)
	e.takeErr(capped(1, "c"), luascript.ErrRequestIDsFull)
	sameHash(t, "after a full cap", e.hash(k), before)

	if r := e.take(capped(1, "a")); !r.Replay {
		t.Fatalf("replay of a recorded id at the cap = %+v, want a replay", r)
	}
	if r := e.take(capped(7, "")); !r.Allowed || r.Used != 9 {
		t.Fatalf("take without an id at the cap = %+v, want allowed, used 9", r)
	}
	// A new id that would be denied anyway is a denial, not a full cap.
	if r := e.take(capped(2, "c")); r.Allowed {
		t.Fatalf("take over the limit at the cap = %+v, want denied", r)
	}
	if ids := e.hash(k)["ids"]; ids != "2" {
		t.Fatalf("ids = %q, want 2", ids)
	}
}

func TestTakeHealsWindowWithoutTTL(t *testing.T) {
	e := setup(t)
	k := e.key("u")

	e.take(args(k, 2, 1, ""))
	e.mustDo("PERSIST", k)
	r := e.take(args(k, 2, 1, ""))
	if !r.Allowed || !r.Healed || r.Used != 2 || r.ResetMS != minute {
		t.Fatalf("take on a window without TTL = %+v, want allowed, healed, used 2, reset %d", r, minute)
	}
	if p := e.pttl(k); p <= 0 || p > minute {
		t.Fatalf("PTTL after healing = %d, want in (0, %d]", p, minute)
	}
	if r := e.take(args(k, 2, 1, "")); r.Healed {
		t.Fatalf("second take = %+v, healed a window that had a TTL", r)
	}

	// A full window without TTL would deny forever: a denial heals it too.
	e.mustDo("PERSIST", k)
	if r := e.take(args(k, 2, 1, "")); r.Allowed || !r.Healed || r.ResetMS != minute {
		t.Fatalf("denied take on a window without TTL = %+v, want denied, healed", r)
	}
	if p := e.pttl(k); p <= 0 {
		t.Fatalf("PTTL after a healing denial = %d", p)
	}

	// A refusal heals too, and says so, so the caller can log the repair.
	e.mustDo("PERSIST", k)
	strict := args(k, 3, 1, "")
	strict.Strict = true
	err := e.takeErr(strict, luascript.ErrPolicy)
	var le *luascript.Error
	if !errors.As(err, &le) || !le.Healed || strings.Contains(le.Message, "TTL_RESTORED") {
		t.Fatalf("POLICY refusal on a window without TTL = %#v, want Healed with a clean message", err)
	}
	if p := e.pttl(k); p <= 0 {
		t.Fatalf("PTTL after a healing refusal = %d", p)
	}
	err = e.takeErr(strict, luascript.ErrPolicy)
	if errors.As(err, &le) && le.Healed {
		t.Fatalf("second refusal = %#v, healed a window that had a TTL", err)
	}
}

func TestTakeOnForeignKeyIsWrongType(t *testing.T) {
	e := setup(t)
	for _, tc := range []struct {
		name     string
		setup    []string
		check    []string
		want     string
		takeOnly bool // peek reads no records, so only take notices
	}{
		{"string", []string{"SET", "K", "not a window", "PX", "600000"}, []string{"GET", "K"}, "not a window", false},
		{"list", []string{"RPUSH", "K", "x"}, []string{"LINDEX", "K", "0"}, "x", false},
		{"hash with used not a number", []string{"HSET", "K", "used", "abc", "policy", "5:60000", "ids", "0"}, []string{"HGET", "K", "used"}, "abc", false},
		{"hash with other fields", []string{"HSET", "K", "name", "bob"}, []string{"HGET", "K", "name"}, "bob", false},
		{"hash without policy", []string{"HSET", "K", "used", "1"}, []string{"HGET", "K", "used"}, "1", false},
		{"hash with a malformed record", []string{"HSET", "K", "used", "1", "policy", "5:60000", "ids", "1", "r:a", "x"}, []string{"HGET", "K", "r:a"}, "x", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := e.key(tc.name)
			sub := func(args []string) []string {
				out := append([]string(nil), args...)
				out[1] = k
				return out
			}
			e.mustDo(sub(tc.setup)...)
			e.mustDo("PEXPIRE", k, "600000")
			err := e.takeErr(args(k, 5, 1, "a"), luascript.ErrWrongType)
			if !strings.HasPrefix(err.Error(), "WRONGTYPE ") {
				t.Fatalf("error %q does not start with WRONGTYPE", err)
			}
			if !tc.takeOnly {
				_, err = luascript.Peek(t.Context(), e.c, limits.FixedWindow, luascript.Args{Key: k, Limit: 5, WindowMS: minute})
				if !errors.Is(err, luascript.ErrWrongType) {
					t.Fatalf("peek = %v, want WRONGTYPE", err)
				}
			}
			if got, err := e.do(sub(tc.check)...).ToString(); err != nil || got != tc.want {
				t.Fatalf("value after take = %q, %v; want %q untouched", got, err, tc.want)
			}
		})
	}
}

func TestGoValidationPrecedesRedis(t *testing.T) {
	// A stopped server: any call that reached Redis would fail with a
	// connection error instead of ErrInvalid.
	srv := redistest.Start(t)
	c := srv.Client(t)
	srv.Stop(t)

	ok := luascript.Args{Key: "k", Limit: 5, WindowMS: 1000, Cost: 1, MaxRequestIDs: 10}
	for name, mut := range map[string]func(*luascript.Args){
		"empty key":            func(a *luascript.Args) { a.Key = "" },
		"limit 0":              func(a *luascript.Args) { a.Limit = 0 },
		"limit negative":       func(a *luascript.Args) { a.Limit = -1 },
		"limit too big":        func(a *luascript.Args) { a.Limit = luascript.MaxLimit + 1 },
		"window 0":             func(a *luascript.Args) { a.WindowMS = 0 },
		"window too long":      func(a *luascript.Args) { a.WindowMS = luascript.MaxWindowMS + 1 },
		"cost 0":               func(a *luascript.Args) { a.Cost = 0 },
		"cost above limit":     func(a *luascript.Args) { a.Cost = 6 },
		"max ids 0":            func(a *luascript.Args) { a.MaxRequestIDs = 0 },
		"max ids too big":      func(a *luascript.Args) { a.MaxRequestIDs = luascript.MaxRequestIDsSize + 1 },
		"request id space":     func(a *luascript.Args) { a.RequestID = "a b" },
		"request id colon":     func(a *luascript.Args) { a.RequestID = "a:b" },
		"request id non-ascii": func(a *luascript.Args) { a.RequestID = "é" },
		"request id too long":  func(a *luascript.Args) { a.RequestID = strings.Repeat("a", 65) },
	} {
		a := ok
		mut(&a)
		if _, err := luascript.Take(t.Context(), c, limits.FixedWindow, a); !errors.Is(err, luascript.ErrInvalid) {
			t.Errorf("%s: take = %v, want INVALID", name, err)
		}
	}
	for name, a := range map[string]luascript.Args{
		"empty key": {Limit: 5, WindowMS: 1000},
		"limit 0":   {Key: "k", WindowMS: 1000},
		"window 0":  {Key: "k", Limit: 5},
	} {
		if _, err := luascript.Peek(t.Context(), c, limits.FixedWindow, a); !errors.Is(err, luascript.ErrInvalid) {
			t.Errorf("%s: peek = %v, want INVALID", name, err)
		}
	}
	// The boundary values themselves are valid: the call reaches the
	// stopped server and fails there, and not as a typed error.
	a := ok
	a.RequestID = strings.Repeat("a", 64)
	a.Limit, a.Cost, a.WindowMS, a.MaxRequestIDs = luascript.MaxLimit, luascript.MaxLimit, luascript.MaxWindowMS, luascript.MaxRequestIDsSize
	_, err := luascript.Take(t.Context(), c, limits.FixedWindow, a)
	var typed *luascript.Error
	if err == nil || errors.As(err, &typed) {
		t.Fatalf("take with boundary values on a stopped server = %v, want a connection error", err)
	}
}

// The scripts validate on their own, for any caller that bypasses Go.
func TestScriptsRejectInvalidArguments(t *testing.T) {
	e := setup(t)
	takeSrc := luascript.ScriptText("fixed_window_take.lua")
	peekSrc := luascript.ScriptText("fixed_window_peek.lua")
	bad := []string{"-1", "0", "1.5", "0x1", " 1", "1 ", "1e0", "+1", "01", "", "99999999999999999999", "1000000000000000000000000000000"}

	takeCases := map[string][]string{} // name -> ARGV
	valid := []string{"5", "1000", "1", "10", "0", ""}
	for i, name := range []string{"limit", "window", "cost", "max ids"} {
		for _, v := range bad {
			argv := append([]string(nil), valid...)
			argv[i] = v
			takeCases[name+"="+v] = argv
		}
	}
	for name, argv := range map[string][]string{
		"limit too big":        {"1000000001", "1000", "1", "10", "0", ""},
		"window too long":      {"5", "2678400001", "1", "10", "0", ""},
		"cost above limit":     {"5", "1000", "6", "10", "0", ""},
		"max ids too big":      {"5", "1000", "1", "1000001", "0", ""},
		"strict 2":             {"5", "1000", "1", "10", "2", ""},
		"strict empty":         {"5", "1000", "1", "10", "", ""},
		"request id space":     {"5", "1000", "1", "10", "0", "a b"},
		"request id colon":     {"5", "1000", "1", "10", "0", "a:b"},
		"request id non-ascii": {"5", "1000", "1", "10", "0", "é"},
		"request id too long":  {"5", "1000", "1", "10", "0", strings.Repeat("a", 65)},
		"too few arguments":    {"5", "1000", "1", "10", "0"},
	} {
		takeCases[name] = argv
	}

	k := e.key("u")
	for name, argv := range takeCases {
		res := e.c.Do(t.Context(), e.c.B().Eval().Script(takeSrc).Numkeys(1).Key(k).Arg(argv...).Build())
		if err := res.Error(); err == nil || !strings.HasPrefix(err.Error(), "INVALID ") {
			t.Errorf("take %s %q = %v, want an INVALID error", name, argv, err)
		}
	}
	for _, v := range bad {
		for _, argv := range [][]string{{v, "1000", "0"}, {"5", v, "0"}} {
			res := e.c.Do(t.Context(), e.c.B().Eval().Script(peekSrc).Numkeys(1).Key(k).Arg(argv...).Build())
			if err := res.Error(); err == nil || !strings.HasPrefix(err.Error(), "INVALID ") {
				t.Errorf("peek %q = %v, want an INVALID error", argv, err)
			}
		}
	}
	if n, err := e.do("EXISTS", k).AsInt64(); err != nil || n != 0 {
		t.Fatalf("EXISTS after invalid calls = %d, %v; want no key", n, err)
	}

	// Nor do they touch a live window.
	e.take(args(k, 5, 1, "a"))
	before := e.hash(k)
	res := e.c.Do(t.Context(), e.c.B().Eval().Script(takeSrc).Numkeys(1).Key(k).Arg("5", "60000", "1x", "100", "0", "a").Build())
	if err := res.Error(); err == nil || !strings.HasPrefix(err.Error(), "INVALID ") {
		t.Fatalf("invalid take on a live window = %v, want INVALID", err)
	}
	sameHash(t, "after an invalid take", e.hash(k), before)
}

func TestPeek(t *testing.T) {
	e := setup(t)
	k := e.key("u")
	peek := func(a luascript.Args) luascript.Result {
		t.Helper()
		r, err := luascript.Peek(t.Context(), e.c, limits.FixedWindow, a)
		if err != nil {
			t.Fatalf("peek %+v: %v", a, err)
		}
		return r
	}
	pa := luascript.Args{Key: k, Limit: 5, WindowMS: minute}

	if r := peek(pa); r != (luascript.Result{Remaining: 5}) {
		t.Fatalf("peek without a window = %+v, want nothing used", r)
	}
	if n, _ := e.do("EXISTS", k).AsInt64(); n != 0 {
		t.Fatal("peek created a key")
	}

	e.take(args(k, 5, 3, "a"))
	before, pttl := e.hash(k), e.pttl(k)
	r := peek(pa)
	if !r.Exists || r.Used != 3 || r.ResetMS <= 0 || r.ResetMS > pttl {
		t.Fatalf("peek = %+v, want exists, used 3, reset in (0, %d]", r, pttl)
	}
	sameHash(t, "after peek", e.hash(k), before)

	strict := pa
	strict.Strict, strict.Limit = true, 6
	if _, err := luascript.Peek(t.Context(), e.c, limits.FixedWindow, strict); !errors.Is(err, luascript.ErrPolicy) {
		t.Fatalf("strict peek with another limit = %v, want POLICY", err)
	}
	strict.Limit = 5
	if r := peek(strict); r.Used != 3 {
		t.Fatalf("strict peek with the window's policy = %+v, want used 3", r)
	}

	// Peek never writes, not even a missing TTL.
	e.mustDo("PERSIST", k)
	if r := peek(pa); !r.Exists || r.ResetMS != -1 {
		t.Fatalf("peek on a window without TTL = %+v, want exists, reset -1", r)
	}
	if p := e.pttl(k); p != -1 {
		t.Fatalf("PTTL after peek = %d, want still -1", p)
	}
	if r := e.take(args(k, 5, 1, "")); !r.Healed {
		t.Fatalf("take after peek = %+v, want healed", r)
	}
}

// A lost reply surfaces as a plain, wrapped error: the caller must treat the
// outcome as unknown and not as a refusal.
func TestConnectionErrorIsNotTyped(t *testing.T) {
	e := setup(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{e.srv.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	_, err = luascript.Take(t.Context(), c, limits.FixedWindow, args(e.key("u"), 5, 1, ""))
	var typed *luascript.Error
	if err == nil || errors.As(err, &typed) || !errors.Is(err, rueidis.ErrClosing) {
		t.Fatalf("take on a closed client = %v, want a wrapped rueidis.ErrClosing", err)
	}
	if !strings.HasPrefix(err.Error(), "take: ") {
		t.Fatalf("error %q does not name the operation", err)
	}
}

// A window written to the append-only file comes back with its use, records
// and remaining TTL, so a retry after a Redis restart is still a replay.
func TestWindowSurvivesRestartWithAOF(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "always"))
	e := &env{t: t, srv: srv, c: srv.Client(t), prefix: randomPrefix(t)}
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, e.c, e.prefix) })
	k := e.key("u")

	e.take(args(k, 5, 2, "a"))
	pttl := e.pttl(k)
	srv.Restart(t)

	// The client reconnects on its own; its first command may still see the
	// old connection fail, which is exactly an unknown outcome.
	var r luascript.Result
	var err error
	for range 3 {
		if r, err = luascript.Take(t.Context(), e.c, limits.FixedWindow, args(k, 5, 2, "a")); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("take after restart: %v", err)
	}
	if !r.Replay || r.Used != 2 || r.ResetMS <= 0 || r.ResetMS > pttl {
		t.Fatalf("retry after restart = %+v, want a replay, used 2, reset in (0, %d]", r, pttl)
	}
}

// A window that lost its TTL gets back its own length, even when the take
// that finds it is refused for asking for another window.
func TestHealingUsesTheWindowsOwnLength(t *testing.T) {
	e := setup(t)
	k := e.key("u")
	e.take(args(k, 5, 1, ""))
	e.mustDo("PERSIST", k)
	long := args(k, 5, 1, "")
	long.Strict, long.WindowMS = true, 30*24*3600*1000
	e.takeErr(long, luascript.ErrPolicy)
	if p := e.pttl(k); p <= 0 || p > minute {
		t.Fatalf("PTTL after a refused healing take = %d, want the window's own %d at most", p, minute)
	}

	// A tampered policy field with a zero window must not delete the key
	// mid-script: the caller's window is used instead.
	k2 := e.key("v")
	e.mustDo("HSET", k2, "used", "1", "policy", "5:0", "ids", "0")
	r := e.take(args(k2, 5, 1, ""))
	if !r.Allowed || !r.Healed || r.Used != 2 {
		t.Fatalf("take on a window with a zero stored length = %+v", r)
	}
	if p := e.pttl(k2); p <= 0 || p > minute {
		t.Fatalf("PTTL = %d, want in (0, %d]", p, minute)
	}
}
