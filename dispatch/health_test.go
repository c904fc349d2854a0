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
	st, d := storeVia(t, p, deadline, core)
	waitFor(t, "redis to be up", st.Up)
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

// storeVia opens a store on Redis through the fault proxy p, with a
// --redis-timeout of deadline, whose warnings (the breaker's "redis is
// down") go to core; and a dispatcher on it.
func storeVia(t *testing.T, p *redistest.FaultProxy, deadline time.Duration, core zapcore.Core) (*store.Store, *Dispatcher) {
	t.Helper()
	st, err := store.OpenStore(store.StoreOptions{RedisURL: p.URL(), Timeout: deadline, ProbeInterval: 50 * time.Millisecond,
		Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	d := New(Options{Store: st, AllowInline: true, Logger: zap.New(core), KeyPrefix: "qt:", RedisTimeout: deadline})
	t.Cleanup(d.Close)
	return st, d
}

// A sidecar that starts behind 100 ms of latency has the scripts loaded
// when it connects, so its first batch is decided: it is not sent only
// to be answered NOSCRIPT and sent again with the script's text, two
// round trips and a large one over its deadline.
func TestFreshSidecarBehindLatencyDecidesItsFirstBatch(t *testing.T) {
	r := redistest.Start(t)
	if err := r.Do(t, "SCRIPT", "FLUSH").Error(); err != nil {
		t.Fatal(err)
	}
	p := redistest.StartFaultProxy(t, r.Addr())
	p.SetLatency(redistest.ToClient, 100*time.Millisecond)
	core, logs := observer.New(zapcore.InfoLevel)
	st, d := storeVia(t, p, 400*time.Millisecond, core)
	waitFor(t, "redis to be up", st.Up)
	r.ResetStats(t)
	outs := pipelined(t, d, 64, 1)
	for _, o := range outs {
		if o.Failed() {
			t.Fatalf("a take of the first batch was answered %s %q", o.Code, o.Message)
		}
	}
	if n := r.CommandCalls(t, "eval"); n != 0 {
		t.Fatalf("%d calls sent a script's text (EVAL)", n)
	}
	if n := logs.FilterMessage("loaded scripts into redis").Len(); n == 0 {
		t.Fatal("no log line says the scripts were loaded")
	}
}

// A SCRIPT FLUSH behind a slow link (50 KB/s) costs each script the calls
// need one load, whatever the number of calls that find it missing, and
// no call carries a script's text; the calls that cannot be sent again in
// time are answered "not run", not "outcome unknown", and once the load
// is in, takes are decided again. Redis's health is not in question: the
// breaker stays closed.
func TestScriptFlushBehindASlowLinkLoadsEachScriptOnce(t *testing.T) {
	r := redistest.Start(t)
	p := redistest.StartFaultProxy(t, r.Addr())
	core, logs := observer.New(zapcore.InfoLevel)
	st, d := storeVia(t, p, time.Second, core)
	waitFor(t, "redis to be up", st.Up)
	waitFor(t, "the scripts to be loaded", func() bool { return r.HoldsScripts(t, luascript.Sources()...) })
	pipelined(t, d, 32, 2) // the connections the load needs, before the cap
	p.SetBandwidth(redistest.Both, 50_000)
	if err := r.Do(t, "SCRIPT", "FLUSH").Error(); err != nil {
		t.Fatal(err)
	}
	r.ResetStats(t)
	var outs []Outcome
	for {
		round := pipelined(t, d, 32, 1)
		outs = append(outs, round...)
		if !round[len(round)-1].Failed() {
			break
		}
		if len(outs) > 32*100 {
			t.Fatal("no take was decided after the flush")
		}
	}
	for _, o := range outs {
		if o.Failed() && !strings.Contains(o.Message, "not run") {
			t.Fatalf("a take was answered %s %q, want a decision or not run", o.Code, o.Message)
		}
	}
	// The batch script and the take's own (a batch of one).
	if n := r.CommandCalls(t, "script|load"); n > 2 {
		t.Fatalf("%d SCRIPT LOADs after the flush, want at most one for each of the 2 scripts the takes use", n)
	}
	if n := r.CommandCalls(t, "eval"); n != 0 {
		t.Fatalf("%d calls sent a script's text (EVAL) after the flush", n)
	}
	if down := logs.FilterMessage("redis is down").Len(); down != 0 {
		t.Fatalf("the breaker opened %d times after the flush", down)
	}
}
