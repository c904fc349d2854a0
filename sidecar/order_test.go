package sidecar

import (
	"fmt"
	"strconv"
	"testing"

	"quotad/integration/redistest"
)

// A take and a release of one lease, written back to back on one
// connection, run in that order: the release always frees the lease the
// take just granted. Requests on the same key wait for the one before them;
// without that, the release often reached Redis first and the lease leaked
// for its whole lease_ms.
func TestSameKeyRequestsOfAConnectionRunInOrder(t *testing.T) {
	r := redistest.Start(t)
	ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	const pairs, perWrite = 10_000, 100
	lines := make([]string, 0, 2*perWrite)
	for done := 0; done < pairs; done += perWrite {
		lines = lines[:0]
		for i := done; i < done+perWrite; i++ {
			id := "lease-" + strconv.Itoa(i)
			lines = append(lines,
				fmt.Sprintf(`{"op":"take","id":%d,"subject":"job","algorithm":"concurrency","limit":1,"lease_ms":60000,"request_id":%q}`, 2*i, id),
				fmt.Sprintf(`{"op":"release","id":%d,"subject":"job","algorithm":"concurrency","limit":1,"lease_ms":60000,"request_id":%q}`, 2*i+1, id))
		}
		c.send(lines...)
		for i := done; i < done+perWrite; i++ {
			take, release := c.recv(), c.recv()
			if !take.OK || !take.Allowed {
				t.Fatalf("take %d: %+v (the lease before it leaked)", i, take)
			}
			if !release.OK || !release.Released {
				t.Fatalf("release %d: %+v, want the lease its take granted just before", i, release)
			}
		}
	}
	redistest.AssertAllKeysHaveTTL(t, r.Client(t), testPrefix)
}

// Requests of one connection on the same key never share a batch, since
// each waits for the one before it; requests on different keys do, since
// they run concurrently. Redis is paused so that the requests pile up
// behind the first batches whatever the machine's speed.
func TestOnlyDifferentKeysOfAConnectionRunConcurrently(t *testing.T) {
	for _, tc := range []struct {
		name     string
		subject  func(i int) string
		together bool
	}{
		{"same key", func(int) string { return "one" }, false},
		{"different keys", func(i int) string { return "s" + strconv.Itoa(i) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.Start(t)
			ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true})
			c := ts.dial(t)
			waitRedisOK(t, c)
			const n = 64
			lines := make([]string, n)
			for i := range lines {
				lines[i] = inlineTake(strconv.Itoa(i), tc.subject(i), 1000, "")
			}
			pauseWrites(t, r)
			c.send(lines...)
			waitFor(t, "every take to be read", func() bool { return ts.running() == n })
			unpause(t, r)
			for i := range n {
				got := c.recv()
				if !got.OK || !got.Allowed {
					t.Fatalf("take %d: %+v", i, got)
				}
				if !tc.together && got.Used != int64(i+1) {
					t.Fatalf("take %d of one key: used %d, want %d (out of order)", i, got.Used, i+1)
				}
			}
			decisions, batches := ts.batches(t)
			if decisions != n {
				t.Fatalf("%d decisions sent in batches, want %d", decisions, n)
			}
			if shared := batches < decisions; shared != tc.together {
				t.Fatalf("%d decisions in %d batches: sharing a batch %v, want %v", decisions, batches, shared, tc.together)
			}
		})
	}
}
