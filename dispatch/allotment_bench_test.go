package dispatch

import (
	"strconv"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

// BenchmarkDecideHotKeys is the dispatch path of takes on 100 subjects
// whose limits are not reached, from parallel goroutines, with and
// without an allotment on their policy: what answering from memory saves
// of a decision in Redis.
func BenchmarkDecideHotKeys(b *testing.B) { benchAllotments(b, 100) }

// BenchmarkDecideManyKeys is the same over 10,000 subjects, each too
// seldom taken for a reservation to pay: what allotments cost where they
// do not help.
func BenchmarkDecideManyKeys(b *testing.B) { benchAllotments(b, 10_000) }

func benchAllotments(b *testing.B, subjects int64) {
	cfg, err := policy.ParseConfig([]byte(`
policies:
  plain:
    limit: 1000000000
    window: 1h
  allotted:
    limit: 1000000000
    window: 1h
    allotment: {}
`))
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []string{"plain", "allotted"} {
		b.Run(p, func(b *testing.B) {
			r := redistest.Start(b)
			st, err := store.OpenStore(store.StoreOptions{RedisURL: r.URL(), Logger: zap.NewNop()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(st.Close)
			waitFor(b, "the store to reach redis", st.Up)
			d := New(Options{Store: st, Config: cfg, Logger: zap.NewNop()})
			b.Cleanup(d.Close)
			var n atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var req protocol.Request
				done := make(chan struct{}, 1)
				dec := &Decision{Done: func() { done <- struct{}{} }}
				i := n.Add(1) << 32
				for pb.Next() {
					i++
					line := `{"op":"take","subject":"s` + strconv.FormatInt(i%subjects, 10) + `","policy":"` + p + `"}`
					if err := protocol.Decode([]byte(line), &req); err != nil {
						b.Fatal(err)
					}
					decideSync(d, &req, dec, done)
				}
			})
		})
	}
}
