package luascript_test

import (
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
)

// The embedded store runs the same scripts under gopher-lua; its error
// replies and pcall error tables must map to the same typed errors.
func TestScriptsOnMiniredis(t *testing.T) {
	m, c := startMiniredis(t)
	prefix := randomPrefix(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, prefix) })
	e := &env{t: t, c: c, prefix: prefix}
	k := e.key("u")

	if r := e.take(args(k, 3, 2, "a")); !r.Allowed || r.Used != 2 || r.ResetMS != minute {
		t.Fatalf("first take = %+v, want allowed, used 2, reset %d", r, minute)
	}
	if r := e.take(args(k, 3, 2, "a")); !r.Allowed || !r.Replay || r.Used != 2 {
		t.Fatalf("replay = %+v, want allowed replay, used 2", r)
	}
	if r := e.take(args(k, 3, 2, "b")); r.Allowed || r.Used != 2 {
		t.Fatalf("take over the limit = %+v, want denied, used 2", r)
	}
	e.takeErr(args(k, 3, 1, "a"), luascript.ErrConflict)

	r, err := luascript.Peek(t.Context(), c, limits.FixedWindow, luascript.Args{Key: k, Limit: 3, WindowMS: minute, Strict: true})
	if err != nil || !r.Exists || r.Used != 2 || r.ResetMS <= 0 || r.ResetMS > minute {
		t.Fatalf("peek = %+v, %v; want exists, used 2", r, err)
	}
	_, err = luascript.Peek(t.Context(), c, limits.FixedWindow, luascript.Args{Key: k, Limit: 4, WindowMS: minute, Strict: true})
	if !errors.Is(err, luascript.ErrPolicy) {
		t.Fatalf("strict peek with another limit = %v, want POLICY", err)
	}

	// A batch too: the peek's flags line does not compile here, and
	// ExecMulti falls back as FixedWindowPeek does.
	take, err := luascript.TakeCall(limits.FixedWindow, args(k, 3, 1, "c"))
	if err != nil {
		t.Fatal(err)
	}
	peek, err := luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: k, Limit: 3, WindowMS: minute})
	if err != nil {
		t.Fatal(err)
	}
	res := luascript.ExecMulti(t.Context(), c, []luascript.Call{take, peek})
	if r, err := luascript.ParseTake(res[0]); err != nil || !r.Allowed || r.Used != 3 {
		t.Fatalf("batched take = %+v, %v; want allowed, used 3", r, err)
	}
	if r, err := luascript.ParsePeek(res[1]); err != nil || r.Used != 3 {
		t.Fatalf("batched peek = %+v, %v; want used 3", r, err)
	}

	s := e.key("string")
	if err := m.Set(s, "v"); err != nil {
		t.Fatal(err)
	}
	m.SetTTL(s, time.Minute)
	e.takeErr(args(s, 3, 1, ""), luascript.ErrWrongType)
	if got, _ := m.Get(s); got != "v" {
		t.Fatalf("string after take = %q, want v", got)
	}
	if _, err := luascript.Peek(t.Context(), c, limits.FixedWindow, luascript.Args{Key: s, Limit: 3, WindowMS: minute}); !errors.Is(err, luascript.ErrWrongType) {
		t.Fatalf("peek on a string = %v, want WRONGTYPE", err)
	}
}

// startMiniredis starts the embedded store's engine (miniredis, with TTLs
// on its clock as the sidecar runs it) and a client of it; both end with
// the test.
func startMiniredis(t *testing.T) (*miniredis.Miniredis, rueidis.Client) {
	t.Helper()
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return m, c
}
