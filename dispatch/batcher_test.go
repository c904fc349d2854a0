package dispatch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"quotad/integration/redistest"
	"quotad/luascript"
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
			st.Observe("", time.Time{}, store.HealthDown, errors.New("connection refused"))
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

// A batch's decisions, of every algorithm and op, go to Redis as one
// script call per algorithm (its batch script), and each is answered as it
// would be alone: the takes of one subject in order, the denial past the
// limit, a peek and a release among them.
func TestBatchIsOneScriptCallPerAlgorithm(t *testing.T) {
	r := redistest.Start(t)
	st := openStoreProbing(t, r, time.Hour)
	d := newDispatcher(t, st, nil, nil)
	lines := []string{
		`{"op":"take","subject":"a","limit":2,"window_ms":60000}`,
		`{"op":"take","subject":"a","limit":2,"window_ms":60000,"request_id":"x"}`,
		`{"op":"take","subject":"a","limit":2,"window_ms":60000}`,
		`{"op":"peek","subject":"a","limit":2,"window_ms":60000}`,
		`{"op":"take","subject":"b","algorithm":"token_bucket","rate":1,"period_ms":3600000,"burst":1}`,
		`{"op":"take","subject":"b","algorithm":"token_bucket","rate":1,"period_ms":3600000,"burst":1}`,
		`{"op":"take","subject":"c","algorithm":"concurrency","limit":1,"lease_ms":60000,"request_id":"j"}`,
		`{"op":"release","subject":"c","algorithm":"concurrency","limit":1,"lease_ms":60000,"request_id":"j"}`,
		`{"op":"take","subject":"d","algorithm":"sliding_window","limit":1,"window_ms":60000}`,
		`{"op":"take","subject":"d","algorithm":"sliding_window","limit":1,"window_ms":60000}`,
	}
	var batch []*Decision
	answered := 0
	for i, l := range lines {
		req := new(protocol.Request)
		if err := protocol.Decode([]byte(l), req); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		dec := &Decision{Done: func() { answered++ }}
		if _, decided := d.Prepare(req, dec); decided {
			t.Fatalf("request %d was answered without Redis: %+v", i, dec.Out)
		}
		dec.queued = time.Now()
		batch = append(batch, dec)
	}
	c, err := st.Client()
	if err != nil {
		t.Fatal(err)
	}
	if err := luascript.Load(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	r.ResetStats(t)
	d.batch.send(batch, nil)
	if answered != len(lines) {
		t.Fatalf("%d of %d decisions answered", answered, len(lines))
	}
	if n := r.ScriptCalls(t); n != 4 {
		t.Errorf("Redis ran %d script calls for one batch of 4 algorithms, want 4", n)
	}
	for i, want := range []struct {
		allowed bool
		used    int64
	}{{true, 1}, {true, 2}, {false, 2}, {false, 2}, {true, 1}, {false, 1}, {true, 1}, {false, 0}, {true, 1}, {false, 1}} {
		o := batch[i].Out
		if o.Code != "" {
			t.Errorf("%s: error %s %s", lines[i], o.Code, o.Message)
			continue
		}
		switch batch[i].req.Op {
		case protocol.OpPeek:
			if o.Used != want.used {
				t.Errorf("%s: %+v, want used %d", lines[i], o, want.used)
			}
		case protocol.OpRelease:
			if !o.Released {
				t.Errorf("%s: %+v, want the lease released", lines[i], o)
			}
		default:
			if o.Allowed != want.allowed || (o.Algorithm != "token_bucket" && o.Used != want.used) {
				t.Errorf("%s: %+v, want allowed %v, used %d", lines[i], o, want.allowed, want.used)
			}
		}
	}
}

// On a full Redis each decision of a batch that Redis refused is its own
// error, answered UNAVAILABLE, and counted as a refused Redis command, as
// it was when each decision was its own script call.
func TestBatchOnAFullRedisCountsEachRefusal(t *testing.T) {
	r := redistest.Start(t)
	st := openStoreProbing(t, r, time.Hour)
	reg := prometheus.NewRegistry()
	d := New(Options{Store: st, AllowInline: true, Logger: zaptest.NewLogger(t), Registry: reg})
	t.Cleanup(d.Close)
	if o := decide(t, d, `{"op":"take","subject":"live","limit":5,"window_ms":60000}`); !o.Allowed {
		t.Fatalf("take before maxmemory: %+v", o)
	}
	for _, cmd := range [][]string{{"CONFIG", "SET", "maxmemory-policy", "noeviction"}, {"CONFIG", "SET", "maxmemory", "1"}} {
		if err := r.Do(t, cmd...).Error(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = r.Do(t, "CONFIG", "SET", "maxmemory", "0").Error() })
	var batch []*Decision
	for _, l := range []string{
		`{"op":"take","subject":"a","limit":5,"window_ms":60000}`,
		`{"op":"peek","subject":"live","limit":5,"window_ms":60000}`,
		`{"op":"take","subject":"b","limit":5,"window_ms":60000}`,
	} {
		req := new(protocol.Request)
		if err := protocol.Decode([]byte(l), req); err != nil {
			t.Fatal(err)
		}
		dec := &Decision{Done: func() {}}
		if _, decided := d.Prepare(req, dec); decided {
			t.Fatalf("%s was answered without Redis: %+v", l, dec.Out)
		}
		dec.queued = time.Now()
		batch = append(batch, dec)
	}
	d.batch.send(batch, nil)
	for _, i := range []int{0, 2} {
		if o := batch[i].Out; o.Code != protocol.CodeUnavailable {
			t.Errorf("take %d on a full Redis: %+v, want UNAVAILABLE", i, o)
		}
	}
	if o := batch[1].Out; o.Code != "" || o.Used != 1 {
		t.Errorf("peek on a full Redis: %+v, want used 1", o)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var refused float64
	for _, mf := range mfs {
		if mf.GetName() != "quotad_redis_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == "refused" {
					refused += m.GetCounter().GetValue()
				}
			}
		}
	}
	if refused != 2 {
		t.Errorf("quotad_redis_errors_total{kind=\"refused\"} = %v, want 2", refused)
	}
}
