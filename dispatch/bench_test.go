package dispatch

import (
	"strconv"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"

	"quotad/integration/redistest"
	"quotad/protocol"
	"quotad/store"
)

// benchDispatcher decides on a real Redis without test logs, which would
// dominate the profile.
func benchDispatcher(b *testing.B) *Dispatcher {
	b.Helper()
	r := redistest.Start(b)
	st, err := store.OpenStore(store.StoreOptions{RedisURL: r.URL(), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	waitFor(b, "the store to reach redis", st.Up)
	d := New(Options{Store: st, AllowInline: true, Logger: zap.NewNop()})
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
	d := benchDispatcher(b)
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
