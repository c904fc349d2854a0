package luascript_test

import (
	"testing"

	"quotad/luascript"
)

// ExecMulti answers each call as Exec would, in order, and a script Redis
// no longer holds (SCRIPT FLUSH) is run anyway, once.
func TestExecMultiMatchesExec(t *testing.T) {
	for _, flush := range []bool{false, true} {
		t.Run(map[bool]string{false: "cached", true: "after-script-flush"}[flush], func(t *testing.T) {
			e := setup(t)
			a, b := e.key("a"), e.key("b")
			if flush {
				e.mustDo("SCRIPT", "FLUSH")
			}
			var calls []luascript.Call
			add := func(c luascript.Call, err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				calls = append(calls, c)
			}
			add(luascript.TakeCall(args(a, 3, 2, "")))
			add(luascript.PeekCall(luascript.PeekArgs{Key: a, Limit: 3, WindowMS: minute}))
			add(luascript.TakeCall(args(a, 3, 2, "")))     // denied: 2+2 > 3
			add(luascript.TakeCall(args(b, 3, 1, "id-1"))) // another key
			add(luascript.TakeCall(args(b, 3, 1, "id-1"))) // its replay
			add(luascript.PeekCall(luascript.PeekArgs{Key: e.key("none"), Limit: 3, WindowMS: minute}))

			res := luascript.ExecMulti(t.Context(), e.c, calls)
			if len(res) != len(calls) {
				t.Fatalf("%d results for %d calls", len(res), len(calls))
			}
			take := func(i int) luascript.TakeResult {
				t.Helper()
				r, err := luascript.ParseTake(res[i])
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				return r
			}
			peek := func(i int) luascript.PeekResult {
				t.Helper()
				r, err := luascript.ParsePeek(res[i])
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				return r
			}
			if r := take(0); !r.Allowed || r.Used != 2 {
				t.Errorf("take 0 = %+v, want allowed, used 2", r)
			}
			if r := peek(1); !r.Exists || r.Used != 2 {
				t.Errorf("peek 1 = %+v, want used 2", r)
			}
			if r := take(2); r.Allowed || r.Used != 2 {
				t.Errorf("take 2 = %+v, want denied, used 2", r)
			}
			if r := take(3); !r.Allowed || r.Replay || r.Used != 1 {
				t.Errorf("take 3 = %+v, want allowed, used 1", r)
			}
			if r := take(4); !r.Allowed || !r.Replay || r.Used != 1 {
				t.Errorf("take 4 = %+v, want a replay, used 1", r)
			}
			if r := peek(5); r.Exists || r.Used != 0 {
				t.Errorf("peek 5 = %+v, want no window", r)
			}
			// Each take ran once: a NOSCRIPT fallback that ran a take twice
			// would show here.
			if h := e.hash(a); h["used"] != "2" {
				t.Errorf("used of a = %q, want 2", h["used"])
			}
			if h := e.hash(b); h["used"] != "1" {
				t.Errorf("used of b = %q, want 1", h["used"])
			}
		})
	}
}

// A call that fails validation is never built, as FixedWindowTake refuses
// it before Redis.
func TestCallValidates(t *testing.T) {
	if _, err := luascript.TakeCall(args("k", 3, 4, "")); err == nil {
		t.Error("TakeCall with cost above the limit: no error")
	}
	if _, err := luascript.PeekCall(luascript.PeekArgs{Key: "", Limit: 3, WindowMS: minute}); err == nil {
		t.Error("PeekCall without a key: no error")
	}
}
