package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are one server's Prometheus collectors, in a registry of its own
// (a process may run several servers, as the tests do). The decisions'
// own metrics are the dispatcher's, registered on the same registry.
type metrics struct {
	reg     *prometheus.Registry
	reloads *prometheus.CounterVec
	// traceInvalid counts requests that carried a trace context field
	// that was ignored (protocol.Request.TraceInvalid).
	traceInvalid prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotad_config_reloads_total",
		Help: "Policy file reloads, by result: ok or failed (the config in use was kept).",
	}, []string{"result"})
	m.traceInvalid = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quotad_trace_context_invalid_total",
		Help: "Requests whose traceparent or tracestate was ignored: malformed, all-zero ids, not a string, given twice or inside a check. The request was decided as if it had none.",
	})
	up := func() float64 {
		if s.store != nil && s.store.Up() {
			return 1
		}
		return 0
	}
	m.reg.MustRegister(m.reloads, m.traceInvalid,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "quotad_redis_up",
			Help: "1 when Redis answered the last call or probe; 0 when it is down (the breaker is open) or not reached yet.",
		}, up),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "quotad_connections",
			Help: "Open client connections.",
		}, func() float64 { return float64(s.Conns()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "quotad_build_info",
			Help:        "Always 1; the version label says which quotad runs.",
			ConstLabels: prometheus.Labels{"version": s.opts.Version},
		}, func() float64 { return 1 }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newNodeUpCollector(s),
	)
	// Series that exist from the start, so a dashboard shows 0, not nothing.
	for _, r := range []string{"ok", "failed"} {
		m.reloads.WithLabelValues(r)
	}
	return m
}
