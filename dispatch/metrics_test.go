package dispatch

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
	"quotad/protocol"
)

// A flood of decisions is sampled: lines beyond the per-second allowance
// are dropped and counted, never all written.
func TestDecisionLogIsSampled(t *testing.T) {
	saved := decisionSampling
	decisionSampling.first, decisionSampling.thereafter = 1, 0 // one line per second
	t.Cleanup(func() { decisionSampling = saved })
	r := redistest.Start(t)
	st := openStore(t, r)
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewRegistry()
	d := New(Options{Store: st, AllowInline: true, LogDecisions: LogDecisionsAll, Logger: zap.New(core), Registry: reg})
	t.Cleanup(d.Close)
	const n = 50
	for range n {
		if o := decide(t, d, `{"op":"take","subject":"flood","limit":1000,"window_ms":60000}`); !o.Allowed {
			t.Fatalf("take: %+v", o)
		}
	}
	logged := float64(logs.FilterLoggerName("decision").Len())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var dropped float64
	for _, mf := range mfs {
		if mf.GetName() == "quotad_decision_log_dropped_total" {
			dropped = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	// 50 takes one after another finish within a few seconds even on a
	// loaded machine, so most share a second with another.
	if logged+dropped != n || logged >= n/2 {
		t.Fatalf("logged %v, dropped %v of %d decisions; want them to add up, with most dropped", logged, dropped, n)
	}
}

// The children memoized by index count in the series their labels name,
// for every op, result and algorithm they hold, and an error code or a
// policy beside them.
func TestMetricsCellsCountInTheirSeries(t *testing.T) {
	m := newMetrics(nil, Options{Logger: zap.NewNop()})
	results := append(resultLabels[:], string(protocol.CodeUnavailable))
	// Ops 1 to the first beyond the cells ("unknown", as op 0).
	for op := protocol.Op(1); int(op) <= numOps; op++ {
		for range 2 {
			m.latency(op).Observe(0.001)
		}
		if got := histogramCount(t, m.duration.WithLabelValues(op.String())); got != 2 {
			t.Errorf("latency of %s observed %d times, want 2", op, got)
		}
		for _, r := range results {
			for range 2 {
				m.request(op, r).Inc()
			}
			if got := counterValue(t, m.requests.WithLabelValues(op.String(), r)); got != 2 {
				t.Errorf("requests %s %s = %v, want 2", op, r, got)
			}
		}
	}
	for _, policy := range []string{"", "per-user"} {
		for _, alg := range append(algorithmLabels[:], "unknown") {
			for _, r := range results {
				for range 2 {
					m.decision(policy, alg, r).Inc()
				}
				if got := counterValue(t, m.decisions.WithLabelValues(policy, alg, r)); got != 2 {
					t.Errorf("decisions %q %s %s = %v, want 2", policy, alg, r, got)
				}
			}
		}
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func histogramCount(t *testing.T, o prometheus.Observer) uint64 {
	t.Helper()
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
