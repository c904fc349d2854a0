package sidecar

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/policy"
)

// A shadow policy answers every take allowed, tells the real verdict, and
// leaves Redis as enforcement would: so switching it to enforce goes on
// from the same window, and its counts are what enforcement would deny.
func TestShadowPolicyAllowsConsumesLikeEnforceAndReportsTheVerdict(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	cfg, err := policy.ParseConfig([]byte("policies:\n  trial:\n    limit: 2\n    window: 1m\n    mode: shadow\n  api:\n    limit: 2\n    window: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Store: st, Config: cfg})
	c := ts.dial(t)
	waitRedisOK(t, c)

	for i, want := range []struct {
		shadowAllowed bool
		used          int64
	}{{true, 1}, {true, 2}, {false, 2}} {
		raw := c.callRaw(`{"op":"take","subject":"s","policy":"trial","request_id":"t` + strconv.Itoa(i) + `"}`)
		got := decodeReply(t, raw)
		if !got.OK || !got.Allowed || !got.Shadow || got.ShadowAllowed != want.shadowAllowed || got.Used != want.used || got.RetryAfterMS != 0 {
			t.Fatalf("shadow take %d = %s: want allowed, shadow, shadow_allowed %v, used %d, retry_after_ms 0", i, raw, want.shadowAllowed, want.used)
		}
		if !strings.HasSuffix(raw, `,"shadow":true,"shadow_allowed":`+map[bool]string{true: "true", false: "false"}[want.shadowAllowed]+`}`) {
			t.Fatalf("shadow take %d = %s: the shadow fields must come last", i, raw)
		}
	}
	rc := r.Client(t)
	key := testPrefix + "fw:{p:trial:s}"
	used, err := rc.Do(context.Background(), rc.B().Hget().Key(key).Field("used").Build()).ToString()
	if err != nil || used != "2" {
		t.Fatalf("used in redis = %q, %v; want 2 (the would-be denial consumed nothing)", used, err)
	}
	if n, _ := rc.Do(context.Background(), rc.B().Hexists().Key(key).Field("r:t2").Build()).AsInt64(); n != 0 {
		t.Fatal("the would-be-denied request id was recorded")
	}

	// Enforced policies keep the reply they always had.
	raw := c.callRaw(`{"op":"take","subject":"s","policy":"api"}`)
	if strings.Contains(raw, "shadow") {
		t.Fatalf("enforced take = %s: no shadow fields expected", raw)
	}

	// Switching to enforce continues from the shadow window.
	cfg2, err := policy.ParseConfig([]byte("policies:\n  trial:\n    limit: 2\n    window: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts.SetConfig(cfg2)
	if got := c.call(`{"op":"take","subject":"s","policy":"trial"}`); !got.OK || got.Allowed || got.Shadow || got.Used != 2 {
		t.Fatalf("take after switching to enforce = %+v, want denied at used 2", got)
	}

	if n := metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": "trial", "result": "shadow_denied"}); n != 1 {
		t.Fatalf("shadow_denied count = %v, want 1", n)
	}
	if n := metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": "trial", "result": "shadow_allowed"}); n != 2 {
		t.Fatalf("shadow_allowed count = %v, want 2", n)
	}
}

// Shadow mode is a policy's, whatever its algorithm.
func TestShadowAppliesToEveryAlgorithm(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	cfg, err := policy.ParseConfig([]byte(`
policies:
  bucket:
    algorithm: token_bucket
    rate: 1
    period: 1m
    burst: 1
    mode: shadow
  leases:
    algorithm: concurrency
    limit: 1
    lease: 1m
    mode: shadow
`))
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Store: st, Config: cfg})
	c := ts.dial(t)
	waitRedisOK(t, c)
	for _, p := range []string{"bucket", "leases"} {
		for i, wantReal := range []bool{true, false} {
			raw := c.callRaw(`{"op":"take","subject":"s","policy":"` + p + `","request_id":"r` + strconv.Itoa(i) + `"}`)
			got := decodeReply(t, raw)
			if !got.OK || !got.Allowed || !got.Shadow || got.ShadowAllowed != wantReal || got.RetryAfterMS != 0 {
				t.Fatalf("%s take %d = %s: want allowed, shadow, shadow_allowed %v", p, i, raw, wantReal)
			}
		}
	}
}
