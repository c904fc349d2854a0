package dispatch

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
	"quotad/luascript"
	"quotad/store"
)

// pipelined keeps workers takes in flight through d, rounds takes in a row
// each, and returns every outcome.
func pipelined(t *testing.T, d *Dispatcher, workers, rounds int) []Outcome {
	t.Helper()
	var mu sync.Mutex
	var out []Outcome
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				line := `{"op":"take","id":1,"subject":"s` + strconv.Itoa((w*7+i)%200) + `","limit":1000000,"window_ms":3600000}`
				o := decide(t, d, line)
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// A steady latency of 60% of --redis-timeout on every reply, under
// pipelined load, opens no breaker and answers nothing "not run": the
// decisions queued behind the batches at Redis had less than their whole
// deadline there, and only a call that had most of it counts against
// Redis's health. The take that waited longest inside quotad is sent
// within a quarter of the deadline (the batcher's patience), so none waits
// out its deadline unsent.
func TestLatencyBelowTheDeadlineOpensNoBreaker(t *testing.T) {
	const deadline = 2 * time.Second
	r := redistest.Start(t)
	p := redistest.StartFaultProxy(t, r.Addr())
	core, logs := observer.New(zapcore.WarnLevel)
	st, err := store.OpenStore(store.StoreOptions{RedisURL: p.URL(), Timeout: deadline, ProbeInterval: 50 * time.Millisecond,
		Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	waitFor(t, "redis to be up", st.Up)
	d := New(Options{Store: st, AllowInline: true, Logger: zap.New(core), KeyPrefix: "qt:", RedisTimeout: deadline})
	t.Cleanup(d.Close)
	// Every script in Redis first: this test is about health, not loading.
	if err := luascript.Load(t.Context(), r.Client(t)); err != nil {
		t.Fatal(err)
	}

	// The same load without the latency first: rueidis opens its
	// connections to Redis as the load needs them, and a connection's
	// handshake under the latency would be part of its first call.
	pipelined(t, d, 128, 2)
	p.SetLatency(redistest.ToClient, deadline*60/100)
	outs := pipelined(t, d, 128, 3)
	p.SetLatency(redistest.ToClient, 0)

	decided := 0
	for _, o := range outs {
		if o.Failed() && strings.Contains(o.Message, "not run") {
			t.Fatalf("a take was answered %s %q under a latency of 60%% of the deadline", o.Code, o.Message)
		}
		if !o.Failed() {
			decided++
		}
	}
	if decided == 0 {
		t.Fatalf("no take of %d was decided under the latency", len(outs))
	}
	if down := logs.FilterMessage("redis is down").Len(); down != 0 {
		t.Fatalf("the breaker opened %d times under a latency of 60%% of the deadline", down)
	}
	if !st.Up() {
		t.Fatal("the store is not up after the latency")
	}
}
