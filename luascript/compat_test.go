package luascript_test

import (
	"strings"
	"testing"

	"quotad/limits"
	"quotad/luascript"
)

// Rolling upgrades mix sidecars of the previous release and this one on the
// same keys. testdata/ holds the previous release's take scripts: a hash
// either writes is read by the other as its own, and both write the same
// fields.

// evalOld runs a previous release's script and returns its integer reply.
func (e *env) evalOld(name, key string, argv ...string) []int64 {
	e.t.Helper()
	v, err := e.c.Do(e.t.Context(), e.c.B().Eval().Script(mustRead(e.t, "testdata/old_"+name)).Numkeys(1).Key(key).Arg(argv...).Build()).AsIntSlice()
	if err != nil {
		e.t.Fatalf("old %s %q: %v", name, argv, err)
	}
	return v
}

// sameFields fails unless two hashes have the same field names.
func sameFields(t *testing.T, what string, a, b map[string]string) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: fields %v and %v differ", what, a, b)
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			t.Fatalf("%s: fields %v and %v differ", what, a, b)
		}
	}
}

func TestFixedWindowLayoutAcrossReleases(t *testing.T) {
	e := setup(t)
	old, cur := e.key("old"), e.key("new")
	// The same takes, one key by each release: the same hash.
	if v := e.evalOld("fixed_window_take.lua", old, "5", "60000", "2", "10", "0", "a"); v[0] != 1 || v[1] != 2 {
		t.Fatalf("old take = %v", v)
	}
	e.take(luascript.Args{Key: cur, Limit: 5, WindowMS: 60000, Cost: 2, MaxRequestIDs: 10, RequestID: "a"})
	sameHash(t, "after one take each", e.hash(cur), e.hash(old))

	// This release reads what the previous one wrote...
	a := luascript.Args{Key: old, Limit: 5, WindowMS: 60000, Cost: 2, MaxRequestIDs: 10, RequestID: "a"}
	if r := e.take(a); !r.Replay || r.Used != 2 {
		t.Fatalf("replay of an old record = %+v", r)
	}
	a.RequestID, a.Cost = "b", 1
	if r := e.take(a); !r.Allowed || r.Replay || r.Used != 3 {
		t.Fatalf("take on an old window = %+v, want used 3", r)
	}
	if p, err := luascript.Peek(t.Context(), e.c, limits.FixedWindow, luascript.Args{Key: old, Limit: 5, WindowMS: 60000}); err != nil || p.Used != 3 {
		t.Fatalf("peek of an old window = %+v, %v", p, err)
	}
	// ...and the previous one reads what this one wrote.
	if v := e.evalOld("fixed_window_take.lua", old, "5", "60000", "1", "10", "0", "b"); v[0] != 1 || v[1] != 3 || v[2] != 1 {
		t.Fatalf("old replay of a new record = %v, want {1 3 1 ...}", v)
	}
	if v := e.evalOld("fixed_window_take.lua", cur, "5", "60000", "3", "10", "0", "c"); v[0] != 1 || v[1] != 5 {
		t.Fatalf("old take on a new window = %v, want used 5", v)
	}
	if h := e.hash(cur); h["ids"] != "2" || h["r:c"] != "3:5" || h["used"] != "5" {
		t.Fatalf("window after an old take = %v", h)
	}
}

func TestTokenBucketLayoutAcrossReleases(t *testing.T) {
	e := setup(t)
	old, cur := e.tbKey("old"), e.tbKey("new")
	// 1 token per hour, so no token comes back during the test.
	argv := func(cost, id string) []string {
		return []string{"1", "3600000", "5", cost, "60000", "10", "0", id}
	}
	a := luascript.Args{Key: cur, TokenBucket: luascript.TokenBucket{Rate: 1, PeriodMS: 3600000, Burst: 5}, Cost: 2, DedupeMS: 60000, MaxRequestIDs: 10, RequestID: "a"}

	if v := e.evalOld("token_bucket_take.lua", old, argv("2", "a")...); v[0] != 1 || v[2] != 3 {
		t.Fatalf("old take = %v", v)
	}
	e.tbTake(a)
	ho, hn := e.hash(old), e.hash(cur)
	// This release writes only what changed: ids, qh and qt, absent, read
	// as 0 in both releases, so a 0 the previous one wrote may be left out.
	for f, v := range ho {
		if _, ok := hn[f]; !ok && !(v == "0" && (f == "ids" || f == "qh" || f == "qt")) {
			t.Fatalf("after one take each: fields %v and %v differ", ho, hn)
		}
	}
	for f := range hn {
		if _, ok := ho[f]; !ok {
			t.Fatalf("after one take each: fields %v and %v differ", ho, hn)
		}
	}
	for _, f := range []string{"policy", "ids", "qt", "rem"} {
		if ho[f] != hn[f] {
			t.Fatalf("field %s: old %q, new %q", f, ho[f], hn[f])
		}
	}
	// Records hold Redis's clock: the same up to it.
	if !strings.HasPrefix(hn["r:a"], "2:3:") || !strings.HasPrefix(ho["r:a"], "2:3:") || !strings.HasPrefix(hn["q:0"], "a:") {
		t.Fatalf("records: old %v, new %v", ho, hn)
	}

	// This release reads what the previous one wrote...
	a.Key = old
	if r := e.tbTake(a); !r.Replay || r.Remaining != 3 {
		t.Fatalf("replay of an old record = %+v", r)
	}
	a.Cost, a.RequestID = 1, "b"
	if r := e.tbTake(a); !r.Allowed || r.Replay || r.Remaining != 2 {
		t.Fatalf("take on an old bucket = %+v, want 2 left", r)
	}
	if p := e.tbPeek(a); p.Remaining != 2 {
		t.Fatalf("peek of an old bucket = %+v, want 2 left", p)
	}
	// ...and the previous one reads what this one wrote.
	if v := e.evalOld("token_bucket_take.lua", old, argv("1", "b")...); v[0] != 1 || v[1] != 1 || v[2] != 2 {
		t.Fatalf("old replay of a new record = %v, want {1 1 2 ...}", v)
	}
	if v := e.evalOld("token_bucket_take.lua", cur, argv("3", "c")...); v[0] != 1 || v[2] != 0 {
		t.Fatalf("old take on a new bucket = %v, want 0 left", v)
	}
	if h := e.hash(cur); h["ids"] != "2" || h["qt"] != "2" || !strings.HasPrefix(h["r:c"], "3:0:") {
		t.Fatalf("bucket after an old take = %v", h)
	}

	// A bucket this release wrote without request ids holds no ids, qh or
	// qt, and the previous release takes from it and records in it.
	bare := e.tbKey("bare")
	e.tbTake(luascript.Args{Key: bare, TokenBucket: a.TokenBucket, Cost: 1, DedupeMS: 60000, MaxRequestIDs: 10})
	if h := e.hash(bare); len(h) != 3 || h["tat"] == "" || h["rem"] != "0" || h["policy"] != "1:3600000:5" {
		t.Fatalf("bucket after a take without a request id = %v, want tat, rem and policy only", h)
	}
	if v := e.evalOld("token_bucket_take.lua", bare, argv("1", "d")...); v[0] != 1 || v[1] != 0 || v[2] != 3 {
		t.Fatalf("old take on a bare bucket = %v, want 3 left", v)
	}
	if h := e.hash(bare); h["ids"] != "1" || h["qh"] != "0" || h["qt"] != "1" {
		t.Fatalf("bare bucket after an old take = %v", h)
	}
	if r := e.tbTake(luascript.Args{Key: bare, TokenBucket: a.TokenBucket, Cost: 1, DedupeMS: 60000, MaxRequestIDs: 10, RequestID: "d"}); !r.Replay || r.Remaining != 3 {
		t.Fatalf("replay of the old record on a bare bucket = %+v", r)
	}
}

func TestLeaseSetLayoutAcrossReleases(t *testing.T) {
	e := setup(t)
	old, cur := e.ccKey("old"), e.ccKey("new")
	if v := e.evalOld("concurrency_take.lua", old, "2", "60000", "0", "a"); v[0] != 1 || v[2] != 1 {
		t.Fatalf("old take = %v", v)
	}
	e.acquire(lease(cur, 2, 60000, "a"))
	ho, hn := e.hash(old), e.hash(cur)
	sameFields(t, "after one take each", ho, hn)
	if ho["policy"] != hn["policy"] {
		t.Fatalf("policy: old %q, new %q", ho["policy"], hn["policy"])
	}

	// This release reads what the previous one wrote...
	if r := e.acquire(lease(old, 2, 60000, "a")); !r.Replay || r.Used != 1 {
		t.Fatalf("renewal of an old lease = %+v", r)
	}
	if r := e.acquire(lease(old, 2, 60000, "b")); !r.Allowed || r.Used != 2 {
		t.Fatalf("take on an old set = %+v", r)
	}
	if p := e.leasePeek(old, 2, 60000); p.Used != 2 {
		t.Fatalf("peek of an old set = %+v", p)
	}
	if r := e.release(old, "a"); !r.Released || r.Used != 1 {
		t.Fatalf("release on an old set = %+v", r)
	}
	// ...and the previous one reads what this one wrote.
	if v := e.evalOld("concurrency_take.lua", cur, "2", "60000", "0", "a"); v[0] != 1 || v[1] != 1 || v[2] != 1 {
		t.Fatalf("old renewal of a new lease = %v, want {1 1 1 ...}", v)
	}
	if v := e.evalOld("concurrency_take.lua", cur, "2", "60000", "0", "b"); v[0] != 1 || v[2] != 2 {
		t.Fatalf("old take on a new set = %v, want used 2", v)
	}
	if v := e.evalOld("concurrency_take.lua", cur, "2", "60000", "0", "c"); v[0] != 0 {
		t.Fatalf("old take over the limit of a new set = %v, want denied", v)
	}
}
