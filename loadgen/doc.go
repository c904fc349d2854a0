// Package loadgen drives a quotad sidecar over its socket as many clients
// would, and measures what they see: decisions per second, latency
// percentiles, and the replies counted by result and error code.
//
// RunRLS does the same for Envoy's rate limit service (ShouldRateLimit
// over gRPC, with go-control-plane's generated client), so that the two
// paths to the same decisions can be compared.
//
// It is a protocol client: it never talks to Redis, so what it measures is
// the whole path a client pays for. It must not make decisions itself or
// retry; every reply it counts is one the sidecar sent.
//
// It should cost as little CPU as it can, since on a small machine it shares
// the cores with the sidecar and Redis it measures. On Linux one goroutine
// drives every connection from an epoll set with raw system calls
// (loop_linux.go): with clients that send one request at a time it spends
// about 12 µs per decision where a reader and a writer goroutine per
// connection spent 25 µs.
package loadgen
