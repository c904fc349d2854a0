// Package rls serves Envoy's rate limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, over gRPC on
// a Unix socket and/or a TCP address, from envoyproxy/ratelimit's
// descriptors files (package descriptors).
//
// A call is one decision: every request descriptor that matches a limit
// becomes one check of one all-or-nothing take (dispatch.PrepareGiven), so
// a request over any limit consumes nothing anywhere. A plain descriptor
// counts in windows of its unit (times unit_multiplier) aligned to the Unix
// epoch, as envoyproxy/ratelimit does (limits.EpochWindow), under a key of
// its own (luascript.EnvoyCalendarKey); one that names a quotad policy
// (quotad_policy) takes from that policy with the value of its last entry
// as the subject, the same counter the JSON socket's takes of that policy
// and subject use. docs/envoy.md is the user's description.
//
// It never decides itself and never talks to Redis: dispatch does both.
// It never changes the JSON socket's protocol.
package rls
