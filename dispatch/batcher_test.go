package dispatch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/protocol"
	"quotad/store"
)

// A batch is not sent when its decisions can no longer be run in time: the
// oldest already waited --redis-timeout behind earlier batches, or the
// breaker opened while they waited. They are answered UNAVAILABLE, not
// run, and Redis runs nothing.
func TestBatchThatCannotRunInTimeIsNotSent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(d *Dispatcher, st *store.Store, dec *Decision)
	}{
		{"past its deadline", func(d *Dispatcher, _ *store.Store, dec *Decision) {
			dec.queued = time.Now().Add(-d.opts.RedisTimeout) // it waited its whole deadline
		}},
		{"breaker opened", func(_ *Dispatcher, st *store.Store, _ *Decision) {
			st.Observe("", errors.New("connection refused"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.Start(t)
			// Probes far apart: none closes the breaker the test opens.
			st := openStoreProbing(t, r, time.Hour)
			d := newDispatcher(t, st, nil, nil)
			var req protocol.Request
			if err := protocol.Decode([]byte(`{"op":"take","id":7,"subject":"late","limit":5,"window_ms":60000}`), &req); err != nil {
				t.Fatal(err)
			}
			done := false
			dec := &Decision{Done: func() { done = true }}
			if _, decided := d.Prepare(&req, dec); decided {
				t.Fatalf("the take was answered without Redis: %+v", dec.Out)
			}
			dec.queued = time.Now()
			tc.spoil(d, st, dec)
			r.ResetStats(t)
			d.batch.send([]*Decision{dec}, nil)
			if !done {
				t.Fatal("the decision was not answered")
			}
			if o := dec.Out; o.Code != protocol.CodeUnavailable || !strings.Contains(o.Message, "not run") {
				t.Fatalf("outcome %+v, want UNAVAILABLE: not run", o)
			}
			if n := r.ScriptCalls(t); n != 0 {
				t.Fatalf("Redis ran %d scripts for a batch that could not run in time", n)
			}
		})
	}
}
