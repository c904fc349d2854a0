package luascript_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"quotad/limits"
	"quotad/luascript"
)

// Under maxmemory with noeviction, Redis refuses a script's first write and
// allows every later one. Each path of the take script makes its one
// deciding write first, so a full Redis leaves every window as it was, or
// (a window without TTL) restores the TTL and then decides in full.
func TestFullRedisRefusesTheFirstWriteAndNothingIsHalfWritten(t *testing.T) {
	e := setup(t)
	e.mustDo("CONFIG", "SET", "maxmemory-policy", "noeviction")
	live, healing, fresh := e.key("live"), e.key("healing"), e.key("fresh")
	e.take(args(live, 5, 2, "a"))
	e.take(args(healing, 5, 1, ""))
	e.mustDo("PERSIST", healing)
	before := e.hash(live)

	e.mustDo("CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() {
		c := e.c
		if err := c.Do(context.Background(), c.B().Arbitrary("CONFIG", "SET", "maxmemory", "0").Build()).Error(); err != nil {
			t.Errorf("CONFIG SET maxmemory 0: %v", err)
		}
	})
	for _, a := range []luascript.Args{args(live, 5, 1, "b"), args(live, 5, 1, ""), args(fresh, 5, 1, "c")} {
		_, err := luascript.Take(t.Context(), e.c, limits.FixedWindow, a)
		var re *rueidis.RedisError
		if !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "OOM") {
			t.Fatalf("take %+v on a full Redis: %v, want Redis's OOM refusal", a, err)
		}
	}
	sameHash(t, "live window after refused takes", e.hash(live), before)
	if p := e.pttl(live); p <= 0 {
		t.Fatalf("PTTL of the live window = %d", p)
	}
	if n, err := e.do("EXISTS", fresh).AsInt64(); err != nil || n != 0 {
		t.Fatalf("EXISTS of a refused new window = %d, %v", n, err)
	}
	// Writing nothing, replays and denials still answer.
	if r := e.take(args(live, 5, 2, "a")); !r.Replay || r.Used != 2 {
		t.Fatalf("replay on a full Redis = %+v", r)
	}
	if r := e.take(args(live, 5, 4, "")); r.Allowed || r.Used != 2 {
		t.Fatalf("take past the limit on a full Redis = %+v, want a denial", r)
	}
	// Healing writes PEXPIRE first, which Redis never refuses; the HSET
	// after it is then allowed: the take is whole.
	if r := e.take(args(healing, 5, 1, "")); !r.Allowed || !r.Healed || r.Used != 2 {
		t.Fatalf("take on a window without TTL on a full Redis = %+v, want allowed, healed, used 2", r)
	}
	if p := e.pttl(healing); p <= 0 {
		t.Fatalf("PTTL of the healed window = %d", p)
	}
}
