package sidecar

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

func TestParseConfigMode(t *testing.T) {
	cfg, err := ParseConfig([]byte("policies:\n  a:\n    limit: 1\n    window: 1s\n  b:\n    limit: 1\n    window: 1s\n    mode: shadow\n  c:\n    limit: 1\n    window: 1s\n    mode: enforce\n"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a": ModeEnforce, "b": ModeShadow, "c": ModeEnforce} {
		if got := cfg.Policies[name].Mode; got != want {
			t.Errorf("policy %s: mode %q, want %q", name, got, want)
		}
	}
	_, err = ParseConfig([]byte("policies:\n  a:\n    limit: 1\n    window: 1s\n    mode: dry-run\n"))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Policy != "a" || ce.Field != "mode" {
		t.Fatalf("mode dry-run: got %v, want a ConfigError naming policy a, field mode", err)
	}
}

// A shadow policy answers every take allowed, tells the real verdict, and
// leaves Redis as enforcement would: so switching it to enforce goes on
// from the same window, and its counts are what enforcement would deny.
func TestShadowPolicyAllowsConsumesLikeEnforceAndReportsTheVerdict(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	cfg, err := ParseConfig([]byte("policies:\n  trial:\n    limit: 2\n    window: 1m\n    mode: shadow\n  api:\n    limit: 2\n    window: 1m\n"))
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
	cfg2, err := ParseConfig([]byte("policies:\n  trial:\n    limit: 2\n    window: 1m\n"))
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
	cfg, err := ParseConfig([]byte(`
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
