package sidecar

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/protocol"
)

// One-at-a-time clients on different connections share Redis calls: while
// Redis is paused, the first two batches wait at Redis and every request
// that comes meanwhile joins the next batch. Every take is answered, in
// full, once.
func TestGroupBatchesOneAtATimeClientsAcrossConnections(t *testing.T) {
	ts, c, r, _ := startBatchServer(t)
	const conns = 16
	clients := make([]*client, conns)
	for i := range clients {
		clients[i] = ts.dial(t)
	}
	before := ts.batched.Load()
	if err := r.Do(t, "CLIENT", "PAUSE", "300", "ALL").Error(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	lines := make([]string, conns)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = cl.nc.SetDeadline(time.Now().Add(waitTimeout))
			req := fmt.Sprintf(`{"op":"take","id":%d,"subject":"s%d","limit":5,"window_ms":60000}`+"\n", i, i%4)
			if _, errs[i] = io.WriteString(cl.nc, req); errs[i] == nil {
				lines[i], errs[i] = cl.r.ReadString('\n')
			}
		}()
	}
	wg.Wait()
	for i, line := range lines {
		if errs[i] != nil {
			t.Fatalf("connection %d: %v", i, errs[i])
		}
		rep := decodeReply(t, line)
		if !rep.OK || !rep.Allowed || string(rep.ID) != fmt.Sprint(i) {
			t.Fatalf("reply %d: %s, want an allowed take with its own id", i, line)
		}
	}
	// Four subjects, four takes each: each window counted every take once.
	for s := range 4 {
		rep := c.call(fmt.Sprintf(`{"op":"peek","subject":"s%d","limit":5,"window_ms":60000}`, s))
		if !rep.OK || rep.Used != conns/4 {
			t.Fatalf("peek s%d: %+v, want %d used", s, rep, conns/4)
		}
	}
	if n := ts.batched.Load() - before; n < conns {
		t.Fatalf("%d of %d takes went through a batch", n, conns)
	}
	// Every batch of one request falls in the histogram's first bucket.
	var batches, ofOne uint64
	for _, mf := range gather(t, ts.Server) {
		if mf.GetName() == "quotad_redis_batch_requests" {
			h := mf.GetMetric()[0].GetHistogram()
			batches, ofOne = h.GetSampleCount(), h.GetBucket()[0].GetCumulativeCount()
		}
	}
	if batches == 0 || ofOne == batches {
		t.Fatalf("%d batches, %d of them of one request; the requests that came while Redis was paused should have shared one", batches, ofOne)
	}
	redistest.AssertAllKeysHaveTTL(t, r.Client(t), testPrefix)
}

// A batch is not sent when its requests can no longer be run in time:
// the oldest already waited --redis-timeout behind earlier batches, or the
// breaker opened while they waited. Its requests are answered UNAVAILABLE,
// not run, and Redis runs nothing.
func TestGroupBatchThatCannotRunInTimeIsNotSent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(s *Server, st *Store, b *windowBatch)
	}{
		{"past its deadline", func(s *Server, _ *Store, b *windowBatch) {
			b.items[0].start = time.Now().Add(-s.opts.RedisTimeout) // it waited its whole deadline
		}},
		{"breaker opened", func(_ *Server, st *Store, _ *windowBatch) {
			st.setUp(false, false, errors.New("connection refused"))
			// The store probes every 20ms: damp the breaker as a flapping
			// Redis's, so that no probe closes it before send runs.
			st.damper.mu.Lock()
			st.damper.need = maxCloseProbes
			st.damper.mu.Unlock()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, _, r, st := startBatchServer(t)
			s := ts.Server
			sl := newSlot()
			if err := protocol.Decode([]byte(`{"op":"take","id":7,"subject":"late","limit":5,"window_ms":60000}`), &sl.req); err != nil {
				t.Fatal(err)
			}
			l, ok := s.batchable(&sl.req)
			if !ok {
				t.Fatal("a fixed-window take is not batchable")
			}
			b := batches.Get().(*windowBatch)
			if !s.stage(b, sl, l) {
				t.Fatalf("the take was answered without Redis: %s", sl.out)
			}
			tc.spoil(s, st, b)
			resetStats(t, r)
			s.group.send(b)
			if got := string(sl.out); !strings.Contains(got, `"error":"UNAVAILABLE"`) || !strings.Contains(got, "not run") {
				t.Fatalf("reply %s, want UNAVAILABLE: not run", got)
			}
			if n := scriptCalls(t, r); n != 0 {
				t.Fatalf("Redis ran %d scripts for a batch that could not run in time", n)
			}
		})
	}
}
