package rls_test

import (
	"strconv"
	"sync/atomic"
	"testing"
)

// BenchmarkShouldRateLimit: calls of 2 descriptors each (two counters of
// one take) from parallel clients over the Unix socket, against a
// redis-server; every call passes.
func BenchmarkShouldRateLimit(b *testing.B) {
	e := setup(b, `
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: day, requests_per_unit: 1000000000}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 1000000000}
`, apiPolicy)
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	var clients atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		n := int(clients.Add(1))
		client := "c" + strconv.Itoa(n%64)
		for pb.Next() {
			resp, err := e.callErr(request("bench", []string{"client", client}, []string{"path", "/p" + strconv.Itoa(n%8)}))
			if err != nil || resp.GetOverallCode() != ok {
				b.Fatalf("%v, %v", resp, err)
			}
		}
	})
}
