package sidecar

import "github.com/prometheus/client_golang/prometheus"

// Reasons a new connection is refused, as quotad_connections_refused_total
// labels them.
const (
	refusedMaxConns        = "max_conns"
	refusedMaxConnsPerPeer = "max_conns_per_peer"
)

// connMetrics count the connections the server ends or refuses by itself.
type connMetrics struct {
	refused    *prometheus.CounterVec
	idleClosed prometheus.Counter
}

func newConnMetrics(reg prometheus.Registerer) *connMetrics {
	m := &connMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotad_connections_refused_total",
			Help: "New connections answered UNAVAILABLE and closed, by reason: max_conns (--max-conns open already) or max_conns_per_peer (--max-conns-per-peer open already from the same process).",
		}, []string{"reason"}),
		idleClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotad_connections_idle_closed_total",
			Help: "Connections closed because they sent nothing and had no request in flight for --idle-timeout.",
		}),
	}
	reg.MustRegister(m.refused, m.idleClosed)
	// Series that exist from the start, so a dashboard shows 0, not nothing.
	for _, r := range []string{refusedMaxConns, refusedMaxConnsPerPeer} {
		m.refused.WithLabelValues(r)
	}
	return m
}
