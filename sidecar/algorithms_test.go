package sidecar

import (
	"testing"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

const algorithmPolicies = `
policies:
  smooth:
    algorithm: token_bucket
    rate: 1
    period: 1h
    burst: 2
  jobs:
    algorithm: concurrency
    limit: 1
    lease: 1m
  api:
    limit: 5
    window: 1m
`

// algorithmServer serves the policies above on store; the keys it writes
// must all have a TTL when the test ends.
func algorithmServer(t *testing.T, st *store.Store, yaml string) (*testServer, *client) {
	t.Helper()
	cfg, err := policy.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Store: st, AllowInline: true, Config: cfg, RedisTimeout: waitTimeout})
	c := ts.dial(t)
	waitRedisOK(t, c)
	t.Cleanup(func() {
		if client, err := st.Client(); err == nil {
			redistest.AssertAllKeysHaveTTL(t, client, testPrefix)
		}
	})
	return ts, c
}

// Every algorithm behind the same ops, named and inline, and the
// algorithm-specific refusals, on Redis and on the embedded store.
func TestAlgorithmsDispatch(t *testing.T) {
	for _, store := range []string{"redis", "embedded"} {
		t.Run(store, func(t *testing.T) {
			url := ""
			if store == "redis" {
				url = redistest.Start(t).URL()
			}
			_, c := algorithmServer(t, openStore(t, url), algorithmPolicies)
			ok := func(line string) protocol.Reply {
				t.Helper()
				r := c.call(line)
				if !r.OK {
					t.Fatalf("%s = %+v", line, r)
				}
				return r
			}
			if r := ok(`{"op":"take","subject":"u","policy":"smooth","cost":2,"request_id":"a"}`); !r.Allowed || r.Limit != 2 || r.Used != 2 || r.Remaining != 0 || r.ResetMS <= 3_600_000 {
				t.Fatalf("token bucket take = %+v", r)
			}
			if r := ok(`{"op":"take","subject":"u","policy":"smooth","cost":2,"request_id":"a"}`); !r.Replay {
				t.Fatalf("token bucket retry = %+v, want a replay", r)
			}
			if r := ok(`{"op":"take","subject":"u","policy":"smooth"}`); r.Allowed || r.RetryAfterMS <= 0 {
				t.Fatalf("take from an empty bucket = %+v, want denied with retry_after_ms", r)
			}
			checkCode(t, "changed cost", c.call(`{"op":"take","subject":"u","policy":"smooth","cost":1,"request_id":"a"}`), protocol.CodeConflict)
			checkCode(t, "cost above burst", c.call(`{"op":"take","subject":"u","policy":"smooth","cost":3}`), protocol.CodeInvalid)
			if r := ok(`{"op":"peek","subject":"u","policy":"smooth"}`); r.Used != 2 || r.Remaining != 0 {
				t.Fatalf("token bucket peek = %+v", r)
			}
			inlineTB := `{"op":"take","subject":"v","algorithm":"token_bucket","rate":10,"period_ms":1000,"burst":20}`
			if r := ok(inlineTB); !r.Allowed || r.Limit != 20 || r.Remaining != 19 {
				t.Fatalf("inline token bucket = %+v", r)
			}
			checkCode(t, "inline bucket of another shape", c.call(`{"op":"take","subject":"v","algorithm":"token_bucket","rate":10,"period_ms":1000}`), protocol.CodePolicy)

			if r := ok(`{"op":"take","subject":"w","policy":"jobs","request_id":"j1"}`); !r.Allowed || r.LeaseMS != 60000 || r.Used != 1 {
				t.Fatalf("lease = %+v, want granted with lease_ms 60000", r)
			}
			if r := ok(`{"op":"take","subject":"w","policy":"jobs","request_id":"j2"}`); r.Allowed || r.LeaseMS != 0 || r.RetryAfterMS <= 0 {
				t.Fatalf("second lease with limit 1 = %+v, want denied, no lease_ms", r)
			}
			checkCode(t, "lease without request_id", c.call(`{"op":"take","subject":"w","policy":"jobs"}`), protocol.CodeInvalid)
			checkCode(t, "lease of cost 2", c.call(`{"op":"take","subject":"w","policy":"jobs","request_id":"j3","cost":2}`), protocol.CodeInvalid)
			if r := ok(`{"op":"release","subject":"w","policy":"jobs","request_id":"j1"}`); !r.Released || r.Used != 0 {
				t.Fatalf("release = %+v", r)
			}
			if r := ok(`{"op":"release","subject":"w","policy":"jobs","request_id":"j1"}`); r.Released {
				t.Fatalf("second release = %+v, want released false", r)
			}
			checkCode(t, "release on a fixed window", c.call(`{"op":"release","subject":"w","policy":"api","request_id":"j1"}`), protocol.CodeInvalid)
			checkCode(t, "release on an inline token bucket", c.call(`{"op":"release","subject":"w","algorithm":"token_bucket","rate":1,"period_ms":1000,"request_id":"j1"}`), protocol.CodeInvalid)
			inlineCC := `{"op":"take","subject":"x","algorithm":"concurrency","limit":2,"lease_ms":30000,"request_id":"k1"}`
			if r := ok(inlineCC); !r.Allowed || r.LeaseMS != 30000 || r.Limit != 2 {
				t.Fatalf("inline lease = %+v", r)
			}
			if r := ok(inlineCC); !r.Allowed || !r.Replay {
				t.Fatalf("inline lease renewal = %+v, want a replay", r)
			}
			if r := ok(`{"op":"peek","subject":"x","algorithm":"concurrency","limit":2,"lease_ms":30000}`); r.Used != 1 || r.Remaining != 1 {
				t.Fatalf("inline lease peek = %+v", r)
			}
			if r := ok(`{"op":"release","subject":"x","algorithm":"concurrency","limit":2,"lease_ms":30000,"request_id":"k1"}`); !r.Released {
				t.Fatalf("inline release = %+v", r)
			}
		})
	}
}

// A policy whose algorithm changes counts on fresh keys: the old
// algorithm's state is neither read nor touched.
func TestPolicyAlgorithmChangeStartsFresh(t *testing.T) {
	r := redistest.Start(t)
	ts, c := algorithmServer(t, openStore(t, r.URL()), "policies:\n  p:\n    limit: 1\n    window: 1m\n")
	if got := c.call(`{"op":"take","subject":"u","policy":"p"}`); !got.Allowed {
		t.Fatalf("fixed window take = %+v", got)
	}
	if got := c.call(`{"op":"take","subject":"u","policy":"p"}`); got.Allowed {
		t.Fatalf("second fixed window take = %+v, want denied", got)
	}
	cfg, err := policy.ParseConfig([]byte("policies:\n  p:\n    algorithm: token_bucket\n    rate: 1\n    period: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts.SetConfig(cfg)
	if got := c.call(`{"op":"take","subject":"u","policy":"p"}`); !got.OK || !got.Allowed || got.Limit != 1 {
		t.Fatalf("take after the policy became a token bucket = %+v, want a fresh, full bucket", got)
	}
	if n, err := r.Do(t, "EXISTS", testPrefix+"fw:{p:p:u}", testPrefix+"tb:{p:p:u}").AsInt64(); err != nil || n != 2 {
		t.Fatalf("EXISTS of both keys = %d, %v; want the old window untouched beside the new bucket", n, err)
	}
}
