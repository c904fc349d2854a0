package sidecar

import (
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
	"quotad/protocol"
)

// Renewing a live lease writes its new expiry, so under maxmemory with
// noeviction it is refused like any first write: UNAVAILABLE, nothing
// written, the lease keeps the expiry it had. Peeks still answer and a
// release still frees the lease (deleting is never refused), which is what
// docs/redis.md tells a holder to do.
func TestLeaseRenewalUnderMaxmemoryIsRefused(t *testing.T) {
	r := redistest.Start(t, redistest.WithArgs("--maxmemory-policy", "noeviction"))
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	lease := func(op, id string) string {
		return `{"op":"` + op + `","subject":"jobs","algorithm":"concurrency","limit":2,"lease_ms":600000,"request_id":"` + id + `"}`
	}
	if got := c.call(lease("take", "job-1")); !got.OK || !got.Allowed || got.Replay {
		t.Fatalf("first take of the lease = %+v", got)
	}
	key := luascript.ConcurrencyKey(testPrefix, "", "jobs")
	expiry := func() string {
		v, err := r.Do(t, "HGET", key, "l:job-1").ToString()
		if err != nil {
			t.Fatalf("HGET the lease: %v", err)
		}
		return v
	}
	before := expiry()
	// Once Redis's clock has passed the take's millisecond, a renewal that
	// got through would write a later expiry.
	taken, err := strconv.ParseInt(before, 10, 64)
	if err != nil {
		t.Fatalf("lease expiry %q: %v", before, err)
	}
	taken -= 600000
	waitFor(t, "Redis's clock to pass the take", func() bool {
		tm, err := r.Do(t, "TIME").AsStrSlice()
		if err != nil || len(tm) != 2 {
			t.Fatalf("TIME: %v, %v", tm, err)
		}
		sec, _ := strconv.ParseInt(tm[0], 10, 64)
		usec, _ := strconv.ParseInt(tm[1], 10, 64)
		return sec*1000+usec/1000 > taken
	})

	redisOK(t, r, "CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() { redisOK(t, r, "CONFIG", "SET", "maxmemory", "0") })
	got := c.call(lease("take", "job-1"))
	checkCode(t, "renewal on a full Redis", got, protocol.CodeUnavailable)
	if !strings.Contains(got.Message, "out of memory") || !strings.Contains(got.Message, "nothing was written") {
		t.Fatalf("renewal on a full Redis: message %q does not say Redis is full and nothing was written", got.Message)
	}
	if after := expiry(); after != before {
		t.Fatalf("lease expiry after a refused renewal = %s, want unchanged %s", after, before)
	}
	if got := c.call(`{"op":"peek","subject":"jobs","algorithm":"concurrency","limit":2,"lease_ms":600000}`); !got.OK || got.Used != 1 {
		t.Fatalf("peek on a full Redis = %+v, want used 1", got)
	}
	if got := c.call(lease("release", "job-1")); !got.OK || !got.Released || got.Used != 0 {
		t.Fatalf("release on a full Redis = %+v, want released with used 0", got)
	}
	if !st.Up() {
		t.Fatal("a full Redis opened the breaker")
	}

	redisOK(t, r, "CONFIG", "SET", "maxmemory", "0")
	if got := c.call(lease("take", "job-1")); !got.OK || !got.Allowed {
		t.Fatalf("take once Redis has room = %+v", got)
	}
}
