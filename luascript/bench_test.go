package luascript_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/limits"
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
		a := luascript.Args{Key: luascript.FixedWindowKey(prefix, "", "fw"), Limit: luascript.MaxLimit, WindowMS: 60_000, Cost: 1, MaxRequestIDs: 10}
		for b.Loop() {
			if _, err := luascript.Take(ctx, c, limits.FixedWindow, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("token_bucket", func(b *testing.B) {
		bucket := luascript.TokenBucket{Rate: 1_000_000, PeriodMS: 1000, Burst: 1_000_000}
		a := luascript.Args{Key: luascript.TokenBucketKey(prefix, "", "tb"), TokenBucket: bucket, Cost: 1, DedupeMS: bucket.RefillMS(), MaxRequestIDs: 10}
		for b.Loop() {
			if _, err := luascript.Take(ctx, c, limits.TokenBucket, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("token_bucket_request_id", func(b *testing.B) {
		bucket := luascript.TokenBucket{Rate: 1_000_000, PeriodMS: 1000, Burst: 1_000_000}
		a := luascript.Args{Key: luascript.TokenBucketKey(prefix, "", "tbr"), TokenBucket: bucket, Cost: 1, DedupeMS: 100, MaxRequestIDs: luascript.MaxRequestIDsSize}
		i := 0
		for b.Loop() {
			i++
			a.RequestID = "r" + strconv.Itoa(i)
			if _, err := luascript.Take(ctx, c, limits.TokenBucket, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("concurrency_take_release", func(b *testing.B) {
		k := luascript.ConcurrencyKey(prefix, "", "cc")
		a := luascript.Args{Key: k, Limit: 100, LeaseMS: 60_000, RequestID: "job"}
		for b.Loop() {
			if _, err := luascript.Take(ctx, c, limits.Concurrency, a); err != nil {
				b.Fatal(err)
			}
			if _, err := luascript.Release(ctx, c, k, "job"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkScriptTime reports the time Redis spends inside each take
// script, from INFO commandstats (usec_per_call of evalsha), apart from the
// round trip: the figure a change to a script's text moves. On a busy
// machine that wall time includes waiting for a CPU, so it also reports the
// CPU time of redis-server per call (INFO cpu), which also counts reading
// and answering the call. The fixed window and token bucket takes use a
// fresh request id each, the path that records one.
func BenchmarkScriptTime(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	prefix := randomPrefix(b)
	b.Cleanup(func() { redistest.AssertAllKeysHaveTTL(b, c, prefix) })
	ctx := b.Context()
	run := func(b *testing.B, take func(i int) error) {
		if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
			b.Fatal(err)
		}
		cpu0 := redisCPU(b, c)
		i := 0
		for b.Loop() {
			i++
			if err := take(i); err != nil {
				b.Fatal(err)
			}
		}
		info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			b.Fatal(err)
		}
		usec, ok := usecPerCall(info, "evalsha")
		if !ok {
			b.Fatalf("no evalsha in INFO commandstats:\n%s", info)
		}
		b.ReportMetric(usec, "redis-µs/evalsha")
		b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(i), "redis-cpu-µs/op")
	}
	b.Run("fixed_window_fresh_id", func(b *testing.B) {
		a := luascript.Args{Key: luascript.FixedWindowKey(prefix, "", "fw"), Limit: luascript.MaxLimit, WindowMS: 60_000, Cost: 1, MaxRequestIDs: luascript.MaxRequestIDsSize}
		run(b, func(i int) error {
			a.RequestID = "r" + strconv.Itoa(i)
			_, err := luascript.Take(ctx, c, limits.FixedWindow, a)
			return err
		})
	})
	b.Run("token_bucket_fresh_id", func(b *testing.B) {
		bucket := luascript.TokenBucket{Rate: 1_000_000, PeriodMS: 1000, Burst: 1_000_000}
		a := luascript.Args{Key: luascript.TokenBucketKey(prefix, "", "tb"), TokenBucket: bucket, Cost: 1, DedupeMS: 100, MaxRequestIDs: luascript.MaxRequestIDsSize}
		run(b, func(i int) error {
			a.RequestID = "r" + strconv.Itoa(i)
			_, err := luascript.Take(ctx, c, limits.TokenBucket, a)
			return err
		})
	})
	b.Run("concurrency_take_release", func(b *testing.B) {
		k := luascript.ConcurrencyKey(prefix, "", "cc")
		a := luascript.Args{Key: k, Limit: 100, LeaseMS: 60_000, RequestID: "job"}
		run(b, func(int) error {
			if _, err := luascript.Take(ctx, c, limits.Concurrency, a); err != nil {
				return err
			}
			_, err := luascript.Release(ctx, c, k, "job")
			return err
		})
	})
}

// redisCPU is the CPU time redis-server has used, in seconds.
func redisCPU(b *testing.B, c rueidis.Client) float64 {
	info, err := c.Do(b.Context(), c.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", line, err)
			}
			total += f
		}
	}
	return total
}

// usecPerCall reads usec_per_call of cmd from INFO commandstats.
func usecPerCall(info, cmd string) (float64, bool) {
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "usec_per_call="); ok {
				f, err := strconv.ParseFloat(v, 64)
				return f, err == nil
			}
		}
	}
	return 0, false
}
