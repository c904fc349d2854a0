package sidecar

import "github.com/prometheus/client_golang/prometheus"

// nodeUpCollector reports quotad_redis_node_up for each master of a Redis
// Cluster that owns slots, as the store's breaker for it sees it. It reports
// nothing on a single server or Sentinel, where quotad_redis_up says it all.
type nodeUpCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newNodeUpCollector(s *Server) nodeUpCollector {
	return nodeUpCollector{s: s, desc: prometheus.NewDesc("quotad_redis_node_up",
		"On a Redis Cluster, per master that owns slots: 1 when it answered the last call or probe, 0 when it is down (its breaker is open: requests on its slots answer UNAVAILABLE at once) or not reached yet.",
		[]string{"addr"}, nil)}
}

func (c nodeUpCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c nodeUpCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.store == nil {
		return
	}
	for _, n := range c.s.store.Nodes() {
		v := 0.0
		if n.Up {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, n.Addr)
	}
}
