package sidecar

import (
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
)

const degradedConfig = `
policies:
  open:
    limit: 5
    window: 1m
    on_unavailable: allow
  closed:
    limit: 5
    window: 1m
    on_unavailable: deny
  plain:
    limit: 5
    window: 1m
  bucket_open:
    algorithm: token_bucket
    rate: 5
    period: 1s
    on_unavailable: allow
  leases_closed:
    algorithm: concurrency
    limit: 5
    lease: 30s
    on_unavailable: deny
  trial_closed:
    limit: 5
    window: 1m
    mode: shadow
    on_unavailable: deny
`

// checkDegraded checks a take answered by on_unavailable: ok, the mode's
// decision, nothing counted, and marked degraded.
func checkDegraded(t *testing.T, what, line string, allowed bool) {
	t.Helper()
	got := decodeReply(t, line)
	if !got.OK || !got.Degraded || got.Allowed != allowed || got.Replay || got.Limit != 5 || got.Used != 0 || got.Remaining != 5 || got.ResetMS != 0 {
		t.Fatalf("%s: got %s, want a degraded take reply with allowed %v", what, line, allowed)
	}
	if allowed != (got.RetryAfterMS == 0) {
		t.Fatalf("%s: got %s: retry_after_ms must be 0 when allowed and positive when denied", what, line)
	}
	if !strings.HasSuffix(line, `,"degraded":true}`) {
		t.Fatalf("%s: got %s: degraded must be the last field", what, line)
	}
}

// on_unavailable allow and deny answer every kind of UNAVAILABLE with a
// take reply marked degraded; a real decision never carries the field.
func TestOnUnavailableAnswersDegradedTakes(t *testing.T) {
	cfg, err := policy.ParseConfig([]byte(degradedConfig))
	if err != nil {
		t.Fatal(err)
	}
	r := redistest.Start(t)
	addr := r.Addr()
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, Config: cfg, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)

	for _, p := range []string{"open", "closed", "plain"} {
		line := c.callRaw(`{"op":"take","subject":"s","policy":"` + p + `"}`)
		if got := decodeReply(t, line); !got.OK || !got.Allowed || strings.Contains(line, "degraded") {
			t.Fatalf("policy %s with Redis up: got %s, want a real decision without a degraded field", p, line)
		}
	}

	// Each way Redis can leave a take undecided.
	outages := []struct {
		name  string
		start func()
		// peekOK: a full Redis still serves reads.
		peekOK bool
	}{
		{"refused: out of memory", func() { redisOK(t, r, "CONFIG", "SET", "maxmemory", "1") }, true},
		{"breaker open: Redis stopped", func() {
			r.Stop(t)
			waitFor(t, "the breaker to open", func() bool { return !st.Up() })
		}, false},
	}
	for _, o := range outages {
		o.start()
		checkDegraded(t, o.name+", allow", c.callRaw(`{"op":"take","id":1,"subject":"s","policy":"open","request_id":"x"}`), true)
		checkDegraded(t, o.name+", deny", c.callRaw(`{"op":"take","id":2,"subject":"s","policy":"closed","cost":2}`), false)
		checkDegraded(t, o.name+", token bucket, allow", c.callRaw(`{"op":"take","id":4,"subject":"s","policy":"bucket_open"}`), true)
		checkDegraded(t, o.name+", concurrency, deny", c.callRaw(`{"op":"take","id":5,"subject":"s","policy":"leases_closed","request_id":"l1"}`), false)
		if line := c.callRaw(`{"op":"take","id":6,"subject":"s","policy":"trial_closed"}`); !strings.HasSuffix(line, `,"retry_after_ms":0,"shadow":true,"shadow_allowed":false,"degraded":true}`) || !decodeReply(t, line).Allowed {
			t.Fatalf("%s, shadow with deny: got %s, want allowed, shadow_allowed false, degraded", o.name, line)
		}
		checkCode(t, o.name+", error", c.call(`{"op":"take","subject":"s","policy":"plain"}`), protocol.CodeUnavailable)
		checkCode(t, o.name+", inline", c.call(inlineTake("3", "s", 5, "")), protocol.CodeUnavailable)
		// A peek reports usage; there is none to make up.
		if got := c.call(`{"op":"peek","subject":"s","policy":"open"}`); o.peekOK {
			if !got.OK || got.Used != 1 || got.Degraded {
				t.Fatalf("%s, peek = %+v, want the real usage, 1", o.name, got)
			}
		} else {
			checkCode(t, o.name+", peek", got, protocol.CodeUnavailable)
		}
		// Errors that are not UNAVAILABLE stay what they are.
		checkCode(t, o.name+", unknown policy", c.call(`{"op":"take","subject":"s","policy":"nope"}`), protocol.CodeUnknownPolicy)
	}

	redistest.StartAt(t, addr)
	waitFor(t, "the probe to close the breaker", st.Up)
	line := c.callRaw(`{"op":"take","subject":"s","policy":"open","request_id":"x"}`)
	if got := decodeReply(t, line); !got.OK || !got.Allowed || got.Used != 1 || strings.Contains(line, "degraded") {
		t.Fatalf("take once Redis is back: got %s, want a real decision with used 1: the degraded answer counted nothing", line)
	}
}

func redisOK(t *testing.T, r *redistest.Server, args ...string) {
	t.Helper()
	if err := r.Do(t, args...).Error(); err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
}
