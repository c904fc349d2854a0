package sidecar

import (
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
)

const multiModesConfig = `
policies:
  user:
    limit: 2
    window: 1m
  trial:
    limit: 1
    window: 1m
    mode: shadow
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
`

func multiModesServer(t *testing.T) (*testServer, *client, *redistest.Server, *storeHandle) {
	t.Helper()
	r := redistest.Start(t)
	cfg, err := policy.ParseConfig([]byte(multiModesConfig))
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, Config: cfg, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	return ts, c, r, &storeHandle{up: st.Up}
}

type storeHandle struct{ up func() bool }

func metric(t *testing.T, ts *testServer, policy, result string) float64 {
	t.Helper()
	return metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": policy, "result": result})
}

// A shadow check never denies the take: its verdict is its
// shadow_allowed, it consumes when it accepts, and the take goes on
// without it when it would deny. An enforced check's denial denies the
// shadow one too: nothing is consumed.
func TestTakeOfChecksShadowCheckNeverDenies(t *testing.T) {
	ts, c, r, _ := multiModesServer(t)
	take := `{"op":"take","checks":[{"policy":"user","subject":"u"},{"policy":"trial","subject":"u"}]}`
	got := c.call(take)
	if !got.Allowed || !got.Checks[1].Shadow || !got.Checks[1].ShadowAllowed || got.Checks[1].Used != 1 {
		t.Fatalf("first take = %+v", got)
	}
	got = c.call(take)
	if !got.Allowed || got.RetryAfterMS != 0 || !got.Checks[1].Allowed || got.Checks[1].ShadowAllowed || got.Checks[1].Used != 1 ||
		got.Checks[0].Used != 2 {
		t.Fatalf("take the shadow check would deny = %+v: want allowed, the user's used 2, trial's shadow_allowed false", got)
	}
	before := hashes(t, r)
	got = c.call(`{"op":"take","checks":[{"policy":"user","subject":"u"},{"policy":"trial","subject":"v"}]}`)
	if got.Allowed || got.Checks[0].Allowed || !got.Checks[1].ShadowAllowed || got.Checks[1].Used != 0 {
		t.Fatalf("take the user denies = %+v: want denied, trial's shadow_allowed true with nothing used", got)
	}
	sameHashes(t, "after the denied take", hashes(t, r), before)
	for _, m := range []struct {
		policy, result string
		want           float64
	}{{"user", "allowed", 2}, {"user", "denied", 1}, {"trial", "shadow_allowed", 1}, {"trial", "shadow_denied", 1},
		{"trial", "unapplied", 1}} {
		if got := metric(t, ts, m.policy, m.result); got != m.want {
			t.Errorf("decisions of %s, %s = %v, want %v", m.policy, m.result, got, m.want)
		}
	}
}

// A check that accepted in a take another check denied counts as
// unapplied; the local denial then answers the next take from memory,
// skipping the checks it does not need to ask.
func TestTakeOfChecksLocalDenialAndMetricsPerCheck(t *testing.T) {
	ts, c, r, _ := multiModesServer(t)
	for range 2 {
		c.call(`{"op":"take","policy":"user","subject":"full"}`)
	}
	take := `{"op":"take","checks":[{"policy":"open","subject":"a"},{"policy":"user","subject":"full"}]}`
	got := c.call(take)
	if got.Allowed || !got.Checks[0].Allowed || got.Checks[0].Used != 0 || got.Checks[1].Allowed || got.Checks[0].Skipped {
		t.Fatalf("take Redis denies = %+v", got)
	}
	before := hashes(t, r)
	local := metricValue(t, ts.Server, "quotad_local_denials_total", nil)
	got = c.call(take)
	if got.Allowed || !got.Checks[0].Skipped || got.Checks[1].Skipped || got.Checks[1].Allowed || got.RetryAfterMS <= 0 ||
		got.RetryAfterMS != got.Checks[1].RetryAfterMS {
		t.Fatalf("take the local denial answers = %+v: want the first check skipped", got)
	}
	if n := metricValue(t, ts.Server, "quotad_local_denials_total", nil); n != local+1 {
		t.Fatalf("local denials %v, want %v", n, local+1)
	}
	sameHashes(t, "after the denials", hashes(t, r), before)
	// With a request id, Redis decides: it may be a replay.
	if got := c.call(strings.Replace(take, `"checks"`, `"request_id":"x","checks"`, 1)); got.Checks[0].Skipped || got.Allowed {
		t.Fatalf("take with request id = %+v: want Redis's denial", got)
	}
	for _, m := range []struct {
		policy, result string
		want           float64
	}{{"open", "unapplied", 2}, {"open", "skipped", 1}, {"user", "denied", 3}} {
		if got := metric(t, ts, m.policy, m.result); got != m.want {
			t.Errorf("decisions of %s, %s = %v, want %v", m.policy, m.result, got, m.want)
		}
	}
	if n := metricValue(t, ts.Server, "quotad_requests_total", map[string]string{"op": "take", "result": "denied"}); n != 3 {
		t.Errorf("denied takes in quotad_requests_total = %v, want 3 (one per take, not per check)", n)
	}
}

// When Redis cannot decide, the take is degraded only if every check's
// policy answers for it; a deny among them denies.
func TestTakeOfChecksOnUnavailableOfEveryCheck(t *testing.T) {
	_, c, r, st := multiModesServer(t)
	r.Stop(t)
	waitFor(t, "the breaker to open", func() bool { return !st.up() })
	got := c.call(`{"op":"take","checks":[{"policy":"open","subject":"a"},{"policy":"open","subject":"b"}]}`)
	if !got.OK || !got.Allowed || !got.Degraded || !got.Checks[0].Degraded || got.Checks[1].Remaining != 5 {
		t.Fatalf("every check allows = %+v", got)
	}
	got = c.call(`{"op":"take","checks":[{"policy":"open","subject":"a"},{"policy":"closed","subject":"b"}]}`)
	if !got.OK || got.Allowed || !got.Degraded || got.RetryAfterMS <= 0 || !got.Checks[0].Allowed || got.Checks[1].Allowed {
		t.Fatalf("one check denies = %+v", got)
	}
	got = c.call(`{"op":"take","checks":[{"policy":"open","subject":"a"},{"policy":"trial","subject":"b"}]}`)
	checkCode(t, "a check without on_unavailable", got, protocol.CodeUnavailable)
	got = c.call(`{"op":"take","checks":[{"policy":"open","subject":"a"},{"subject":"b","limit":1,"window_ms":1000}]}`)
	checkCode(t, "an inline check", got, protocol.CodeUnavailable)
}
