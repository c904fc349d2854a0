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
// The gRPC server reads and writes the service's messages without
// protobuf's reflection (codec.go), since that was a visible share of a
// call's CPU and allocations: a RateLimitRequest is decoded by hand with
// protowire into go-control-plane's structs, as proto.Unmarshal would
// decode it but for unknown fields, which are dropped
// (FuzzCodecMatchesProto holds the two to the same result on any bytes);
// a response is written by go-control-plane's vtprotobuf marshalers when
// the binary is built with the vtprotobuf build tag. Every other message
// (health, reflection, and responses in a build without the tag) goes
// through grpc's proto codec, unchanged.
//
// It never decides itself and never talks to Redis: dispatch does both.
// It never changes the JSON socket's protocol.
package rls
