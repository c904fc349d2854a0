package sidecar

import (
	"fmt"
	"strconv"
	"testing"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
)

func startDenyServer(t *testing.T, cfg *policy.Config) (*testServer, *client, *redistest.Server) {
	t.Helper()
	r := redistest.Start(t)
	ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true, Config: cfg})
	c := ts.dial(t)
	waitRedisOK(t, c)
	return ts, c, r
}

func TestExhaustedWindowIsDeniedWithoutCallingRedis(t *testing.T) {
	_, c, r := startDenyServer(t, nil)
	for i := 1; i <= 3; i++ {
		if got := c.call(inlineTake(strconv.Itoa(i), "hot", 3, "")); !got.OK || !got.Allowed {
			t.Fatalf("take %d of 3: %+v", i, got)
		}
	}
	if got := c.call(inlineTake("4", "hot", 3, "")); !got.OK || got.Allowed {
		t.Fatalf("take 4 of 3 = %+v, want denied", got)
	}

	// Load the peek script now, so that its first EVALSHA does not fall
	// back to EVAL in the count below.
	c.call(`{"op":"peek","subject":"hot","limit":3,"window_ms":60000}`)
	r.ResetStats(t)
	const flood = 50
	lines := make([]string, flood)
	for i := range lines {
		lines[i] = inlineTake("f"+strconv.Itoa(i), "hot", 3, "")
	}
	c.send(lines...)
	for i := range flood {
		got := c.recv()
		if !got.OK || got.Allowed || got.Used != 3 || got.Remaining != 0 || got.Limit != 3 {
			t.Fatalf("flood take %d = %+v, want denied with used 3 of 3", i, got)
		}
		if got.ResetMS <= 0 || got.ResetMS > 60000 || got.RetryAfterMS != got.ResetMS {
			t.Fatalf("flood take %d: reset_ms %d retry_after_ms %d, want equal and within the 60s window", i, got.ResetMS, got.RetryAfterMS)
		}
	}
	if n := r.ScriptCalls(t); n != 0 {
		t.Fatalf("%d takes on an exhausted window cost Redis %d script calls, want none", flood, n)
	}

	// A request_id may be a replay only Redis can recognise; a peek must
	// show Redis's state. Both go to Redis.
	if got := c.call(inlineTake("r", "hot", 3, `,"request_id":"late-1"`)); !got.OK || got.Allowed {
		t.Fatalf("take with a request_id = %+v, want denied", got)
	}
	if got := c.call(`{"op":"peek","subject":"hot","limit":3,"window_ms":60000}`); !got.OK || got.Used != 3 {
		t.Fatalf("peek = %+v", got)
	}
	if n := r.ScriptCalls(t); n != 2 {
		t.Fatalf("a take with a request_id and a peek made %d script calls, want 2", n)
	}
	// Other limits on the same subject are Redis's to judge: a live inline
	// window with other limits is POLICY, not a local denial.
	checkCode(t, "take with another limit", c.call(inlineTake("p", "hot", 4, "")), protocol.CodePolicy)
}

func TestLocalDenialLetsASmallerCostThrough(t *testing.T) {
	_, c, _ := startDenyServer(t, nil)
	if got := c.call(inlineTake("1", "s", 10, `,"cost":9`)); !got.Allowed {
		t.Fatalf("cost 9 of 10 = %+v", got)
	}
	if got := c.call(inlineTake("2", "s", 10, `,"cost":2`)); !got.OK || got.Allowed {
		t.Fatalf("cost 2 with 1 left = %+v, want denied", got)
	}
	// 9 + 1 fits: only Redis can say so.
	if got := c.call(inlineTake("3", "s", 10, `,"cost":1`)); !got.Allowed || got.Used != 10 {
		t.Fatalf("cost 1 with 1 left = %+v, want allowed with used 10", got)
	}
	if got := c.call(inlineTake("4", "s", 10, `,"cost":1`)); !got.OK || got.Allowed || got.Used != 10 {
		t.Fatalf("cost 1 with none left = %+v, want denied with used 10", got)
	}
}

func TestReloadIsNeverAnsweredFromALocalDenial(t *testing.T) {
	parse := func(limit int) *policy.Config {
		t.Helper()
		cfg, err := policy.ParseConfig([]byte(fmt.Sprintf("policies:\n  api:\n    limit: %d\n    window: 1m\n", limit)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ts, c, r := startDenyServer(t, parse(2))
	take := func(id string) protocol.Reply {
		return c.call(`{"op":"take","id":"` + id + `","subject":"u","policy":"api"}`)
	}
	take("1")
	take("2")
	if got := take("3"); !got.OK || got.Allowed {
		t.Fatalf("third take of 2 = %+v, want denied", got)
	}
	// The same limits under a reloaded config: Redis is asked again.
	ts.SetConfig(parse(2))
	r.ResetStats(t)
	if got := take("4"); !got.OK || got.Allowed {
		t.Fatalf("take after an identical reload = %+v, want denied", got)
	}
	if n := r.ScriptCalls(t); n != 1 {
		t.Fatalf("the first take after a reload made %d script calls, want 1", n)
	}
	// A raised limit applies at once.
	ts.SetConfig(parse(3))
	if got := take("5"); !got.OK || !got.Allowed || got.Used != 3 {
		t.Fatalf("take after raising the limit to 3 = %+v, want allowed with used 3", got)
	}
}

func TestLocalDenialEndsWithTheWindow(t *testing.T) {
	_, c, _ := startDenyServer(t, nil)
	take := `{"op":"take","subject":"w","limit":1,"window_ms":300}`
	if got := c.call(take); !got.Allowed {
		t.Fatalf("first take = %+v", got)
	}
	if got := c.call(take); got.Allowed {
		t.Fatalf("second take = %+v, want denied", got)
	}
	// Once the window is over, a take opens a new one.
	waitFor(t, "a take to be allowed in the next window", func() bool {
		got := c.call(take)
		if !got.OK {
			t.Fatalf("take = %+v", got)
		}
		return got.Allowed && got.Used == 1
	})
}

// A shadow policy's takes are allowed whatever answers them: a local denial
// is a real verdict like Redis's, reported in shadow_allowed.
func TestLocalDenialOfAShadowPolicyStillAllows(t *testing.T) {
	cfg, err := policy.ParseConfig([]byte("policies:\n  trial:\n    limit: 1\n    window: 1m\n    mode: shadow\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, c, r := startDenyServer(t, cfg)
	take := `{"op":"take","subject":"hot","policy":"trial"}`
	if got := c.call(take); !got.OK || !got.Allowed || !got.Shadow || !got.ShadowAllowed {
		t.Fatalf("first take = %+v, want allowed and shadow_allowed", got)
	}
	if got := c.call(take); !got.OK || !got.Allowed || !got.Shadow || got.ShadowAllowed {
		t.Fatalf("second take = %+v, want allowed, shadow_allowed false (Redis's denial)", got)
	}
	r.ResetStats(t)
	for i := range 5 {
		if got := c.call(take); !got.OK || !got.Allowed || !got.Shadow || got.ShadowAllowed || got.RetryAfterMS != 0 {
			t.Fatalf("take %d on the exhausted window = %+v, want allowed, shadow_allowed false, retry_after_ms 0", i, got)
		}
	}
	if n := r.ScriptCalls(t); n != 0 {
		t.Fatalf("the exhausted shadow window cost Redis %d script calls, want none", n)
	}
}

// A window known to be exhausted stays denied while Redis is down: the
// policy's on_unavailable answers only what the sidecar cannot know.
func TestLocalDenialHoldsWhileRedisIsDown(t *testing.T) {
	cfg, err := policy.ParseConfig([]byte("policies:\n  open:\n    limit: 1\n    window: 1m\n    on_unavailable: allow\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts, c, r := startDenyServer(t, cfg)
	take := `{"op":"take","subject":"hot","policy":"open"}`
	if got := c.call(take); !got.OK || !got.Allowed {
		t.Fatalf("first take = %+v", got)
	}
	if got := c.call(take); !got.OK || got.Allowed || got.Degraded {
		t.Fatalf("second take = %+v, want Redis's denial", got)
	}
	r.Stop(t)
	waitFor(t, "the breaker to open", func() bool { return !ts.store.Up() })
	if got := c.call(take); !got.OK || got.Allowed || got.Degraded || got.Used != 1 {
		t.Fatalf("take on the exhausted window with Redis down = %+v, want the known denial, not a degraded allow", got)
	}
	if got := c.call(`{"op":"take","subject":"cold","policy":"open"}`); !got.OK || !got.Allowed || !got.Degraded {
		t.Fatalf("take on another subject with Redis down = %+v, want a degraded allow", got)
	}
}
