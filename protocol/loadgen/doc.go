// Package loadgen drives a quotad sidecar over its socket as many clients
// would, and measures what they see: decisions per second, latency
// percentiles, and the replies counted by result and error code.
//
// It is a protocol client: it never talks to Redis, so what it measures is
// the whole path a client pays for. It must not make decisions itself or
// retry; every reply it counts is one the sidecar sent.
package loadgen
