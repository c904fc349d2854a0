package dispatch

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
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
