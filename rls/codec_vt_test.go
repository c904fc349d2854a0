//go:build vtprotobuf

package rls

import rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

// vtprotobuf: built with go-control-plane's vtprotobuf marshalers, which
// the codec writes responses with.
const vtprotobuf = true

var _ vtMessage = (*rlsv3.RateLimitResponse)(nil)
