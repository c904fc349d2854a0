package sidecar

import (
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/protocol"
)

// A refusal from Redis reaches the client as UNAVAILABLE, and the sidecar
// recovers as soon as Redis accepts writes again.
func TestOutOfMemoryRedisAnswersUnavailable(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	if err := r.Do(t, "CONFIG", "SET", "maxmemory", "1").Error(); err != nil {
		t.Fatal(err)
	}
	got := c.call(inlineTake("1", "oom", 5, ""))
	checkCode(t, "take on a full Redis", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "OOM") {
		t.Fatalf("take on a full Redis: message %q does not say why", got.Message)
	}
	if got := c.call(`{"op":"ping"}`); !got.RedisOK {
		t.Fatalf("ping after a refusal = %+v: Redis answered, so it is up", got)
	}
	if err := r.Do(t, "CONFIG", "SET", "maxmemory", "0").Error(); err != nil {
		t.Fatal(err)
	}
	if got := c.call(inlineTake("2", "oom", 5, "")); !got.OK || !got.Allowed || got.Used != 1 {
		t.Fatalf("take once Redis has room = %+v, want allowed with used 1", got)
	}
}

func TestTimeoutMSShortensTheDeadlineAndARetryConsumesOnce(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	// Without timeout_ms a take would wait for Redis far longer than the test.
	ts := startServer(t, Options{Store: st, AllowInline: true, RedisTimeout: time.Hour})
	c := ts.dial(t)
	waitRedisOK(t, c)
	// Load the script, so the take below reaches Redis as EVALSHA and runs
	// once Redis resumes: the retry then finds it applied.
	if got := c.call(inlineTake("w", "warm", 5, "")); !got.OK || !got.Allowed {
		t.Fatalf("warm-up take = %+v", got)
	}

	pauseWrites(t, r)
	got := c.call(inlineTake("1", "slow", 5, `,"cost":2,"request_id":"slow-1","timeout_ms":50`))
	checkCode(t, "take with timeout_ms 50 on a paused Redis", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "outcome is unknown") {
		t.Fatalf("timed-out take: message %q does not say the outcome is unknown", got.Message)
	}
	// The caller chose a deadline shorter than --redis-timeout: that is not
	// evidence of an outage, so everyone else's ping still says Redis is ok.
	if !st.Up() {
		t.Fatal("a take that ran out of its own timeout_ms marked Redis as down")
	}
	unpause(t, r)

	retry := inlineTake("2", "slow", 5, `,"cost":2,"request_id":"slow-1"`)
	got = c.call(retry)
	if !got.OK || !got.Allowed || got.Used != 2 {
		t.Fatalf("retry with the same request_id = %+v, want allowed with used 2 (a replay or the first acceptance)", got)
	}
	if got := c.call(retry); !got.OK || !got.Replay || got.Used != 2 {
		t.Fatalf("second retry = %+v, want a replay with used 2", got)
	}
	if got := c.call(`{"op":"peek","subject":"slow","limit":5,"window_ms":60000}`); !got.OK || got.Used != 2 {
		t.Fatalf("peek = %+v, want used 2: the cost was consumed once", got)
	}
}
