package rls

import (
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// metrics count the service's calls; each take of a call is counted by
// dispatch too (quotad_requests_total, quotad_decisions_total with the
// policy label "rls:<domain>" for a file's limit).
type metrics struct {
	calls    *prometheus.CounterVec
	duration prometheus.Histogram
	reloads  *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotad_rls_calls_total",
			Help: "ShouldRateLimit calls by result: ok, over_limit, or the gRPC code of a failed call (InvalidArgument, Unavailable, ...).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "quotad_rls_call_duration_seconds",
			Help:    "Time from a ShouldRateLimit call's arrival to its answer, inside quotad.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 15), // 100µs to 1.6s
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotad_rls_config_reloads_total",
			Help: "Descriptors file reloads, by result: ok or failed (the descriptors in use were kept).",
		}, []string{"result"}),
	}
	for _, r := range []string{"ok", "over_limit"} {
		m.calls.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "failed"} {
		m.reloads.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.duration, m.reloads)
	}
	return m
}

// observe counts a call that started at start.
func (m *metrics) observe(start time.Time, resp *rlsv3.RateLimitResponse, err error) {
	m.duration.Observe(time.Since(start).Seconds())
	m.calls.WithLabelValues(resultOf(resp, err)).Inc()
}

// resultOf is a call's result label.
func resultOf(resp *rlsv3.RateLimitResponse, err error) string {
	switch {
	case err != nil:
		return status.Code(err).String()
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
		return "over_limit"
	}
	return "ok"
}
