package dispatch

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"quotad/integration/redistest"
	"quotad/protocol"
	"quotad/store"
)

// benchDispatcher decides on a real Redis without test logs, which would
// dominate the profile.
func benchDispatcher(b *testing.B) *Dispatcher {
	b.Helper()
	return benchDispatcherTracing(b, nil)
}

// benchDispatcherTracing is benchDispatcher with a tracer (nil: none).
func benchDispatcherTracing(b *testing.B, tp trace.TracerProvider) *Dispatcher {
	b.Helper()
	r := redistest.Start(b)
	st, err := store.OpenStore(store.StoreOptions{RedisURL: r.URL(), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	waitFor(b, "the store to reach redis", st.Up)
	d := New(Options{Store: st, AllowInline: true, Logger: zap.NewNop(), Tracer: tp})
	b.Cleanup(d.Close)
	return d
}

// decideSync prepares and runs one decoded request and waits for it.
func decideSync(d *Dispatcher, req *protocol.Request, dec *Decision, done chan struct{}) {
	if _, decided := d.Prepare(req, dec); !decided {
		d.Run(dec)
	}
	<-done
}

// BenchmarkDecideTake is the dispatch path of one take without the socket:
// resolve, the local-deny check, the batched script call and the outcome,
// from parallel goroutines as the connections run them.
func BenchmarkDecideTake(b *testing.B) {
	benchDecideTake(b, benchDispatcher(b))
}

// BenchmarkDecideTakeTraced is BenchmarkDecideTake with tracing on, the
// spans of the decisions sampled at a ratio going through the SDK's
// batch processor to an exporter that drops them: what tracing costs
// quotad, without a collector's share.
func BenchmarkDecideTakeTraced(b *testing.B) {
	for _, ratio := range []float64{0.01, 1} {
		b.Run(fmt.Sprintf("sampled=%v%%", ratio*100), func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()),
				sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			benchDecideTake(b, benchDispatcherTracing(b, tp))
		})
	}
}

func benchDecideTake(b *testing.B, d *Dispatcher) {
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var req protocol.Request
		done := make(chan struct{}, 1)
		dec := &Decision{Done: func() { done <- struct{}{} }}
		i := n.Add(1) << 32
		for pb.Next() {
			i++
			line := `{"op":"take","subject":"s` + strconv.FormatInt(i%10000, 10) + `","limit":1000000,"window_ms":60000}`
			if err := protocol.Decode([]byte(line), &req); err != nil {
				b.Fatal(err)
			}
			decideSync(d, &req, dec, done)
		}
	})
}

// BenchmarkDecideTakeDeniedLocally is the same path for a subject known
// to be exhausted: everything the sidecar spends except Redis.
func BenchmarkDecideTakeDeniedLocally(b *testing.B) {
	d := benchDispatcher(b)
	var req protocol.Request
	line := []byte(`{"op":"take","subject":"hot","limit":1,"window_ms":60000}`)
	done := make(chan struct{}, 1)
	dec := &Decision{Done: func() { done <- struct{}{} }}
	// The first take consumes the limit, the second is denied by Redis,
	// and the third is denied from memory.
	for range 3 {
		if err := protocol.Decode(line, &req); err != nil {
			b.Fatal(err)
		}
		decideSync(d, &req, dec, done)
	}
	if !dec.Out.Local {
		b.Fatalf("the third take was not denied locally: %+v", dec.Out)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := protocol.Decode(line, &req); err != nil {
			b.Fatal(err)
		}
		decideSync(d, &req, dec, done)
	}
}
