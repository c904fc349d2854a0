package luascript_test

import (
	"strconv"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// BenchmarkTake measures one decision of each algorithm against a local
// redis-server, one caller at a time: a round trip plus the script.
func BenchmarkTake(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	prefix := randomPrefix(b)
	b.Cleanup(func() { redistest.AssertAllKeysHaveTTL(b, c, prefix) })
	ctx := b.Context()
	b.Run("fixed_window", func(b *testing.B) {
		a := luascript.TakeArgs{Key: luascript.FixedWindowKey(prefix, "", "fw"), Limit: luascript.MaxLimit, WindowMS: 60_000, Cost: 1, MaxRequestIDs: 10}
		for b.Loop() {
			if _, err := luascript.FixedWindowTake(ctx, c, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("token_bucket", func(b *testing.B) {
		bucket := luascript.TokenBucket{Rate: 1_000_000, PeriodMS: 1000, Burst: 1_000_000}
		a := luascript.TokenBucketArgs{Key: luascript.TokenBucketKey(prefix, "", "tb"), TokenBucket: bucket, Cost: 1, DedupeMS: bucket.RefillMS(), MaxRequestIDs: 10}
		for b.Loop() {
			if _, err := luascript.TokenBucketTake(ctx, c, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("token_bucket_request_id", func(b *testing.B) {
		bucket := luascript.TokenBucket{Rate: 1_000_000, PeriodMS: 1000, Burst: 1_000_000}
		a := luascript.TokenBucketArgs{Key: luascript.TokenBucketKey(prefix, "", "tbr"), TokenBucket: bucket, Cost: 1, DedupeMS: 100, MaxRequestIDs: luascript.MaxRequestIDsSize}
		i := 0
		for b.Loop() {
			i++
			a.RequestID = "r" + strconv.Itoa(i)
			if _, err := luascript.TokenBucketTake(ctx, c, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("concurrency_take_release", func(b *testing.B) {
		k := luascript.ConcurrencyKey(prefix, "", "cc")
		a := luascript.LeaseArgs{Key: k, Leases: luascript.Leases{Limit: 100, LeaseMS: 60_000}, RequestID: "job"}
		for b.Loop() {
			if _, err := luascript.ConcurrencyTake(ctx, c, a); err != nil {
				b.Fatal(err)
			}
			if _, err := luascript.ConcurrencyRelease(ctx, c, k, "job"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
