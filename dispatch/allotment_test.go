package dispatch

import (
	"context"
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
	"quotad/luascript"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

// allotConfig is a policy file with allotments on hot (fixed window),
// month (calendar) and open (fixed window, on_unavailable allow).
func allotConfig(t *testing.T, idle string) *policy.Config {
	t.Helper()
	cfg, err := policy.ParseConfig([]byte(`
policies:
  hot:
    limit: 1000
    window: 1m
    allotment: {max_share: 0.5, idle: ` + idle + `}
  month:
    algorithm: calendar
    limit: 1000
    period: month
    allotment: {max_share: 0.5, idle: ` + idle + `}
  open:
    limit: 1000
    window: 1m
    on_unavailable: allow
    allotment: {max_share: 0.5, idle: ` + idle + `}
  slide:
    algorithm: sliding_window
    limit: 1000
    window: 1h
    allotment: {max_share: 0.5, idle: ` + idle + `}
  bucket:
    algorithm: token_bucket
    rate: 2
    period: 1h
    burst: 1000
    allotment: {max_share: 0.5, idle: ` + idle + `}
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// edgeConfig is a policy file with one sliding window, edge, of window,
// whose allotment is not returned for being idle during a test.
func edgeConfig(t *testing.T, window string) *policy.Config {
	t.Helper()
	cfg, err := policy.ParseConfig([]byte(`
policies:
  edge:
    algorithm: sliding_window
    limit: 1000000
    window: ` + window + `
    allotment: {idle: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newAllotDispatcher(t *testing.T, r *redistest.Server, idle string) (*Dispatcher, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	d := New(Options{Store: openStore(t, r), Config: allotConfig(t, idle), Logger: zaptest.NewLogger(t), KeyPrefix: "qt:", Registry: reg})
	t.Cleanup(d.Close)
	return d, reg
}

// used is what Redis holds as used in the window of policy and subject.
func redisUsed(t *testing.T, r *redistest.Server, policyName, subject string) int64 {
	t.Helper()
	s, err := r.Do(t, "HGET", "qt:fw:{p:"+policyName+":"+subject+"}", "used").ToString()
	if err != nil {
		t.Fatalf("HGET used: %v", err)
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func counterOf(t *testing.T, c *prometheus.CounterVec, policyName string) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.WithLabelValues(policyName).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func gaugeOf(t *testing.T, g *prometheus.GaugeVec, policyName string) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.WithLabelValues(policyName).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// openStoreThrough opens a store on the Redis behind p, with deadline
// timeout and a fast probe, closed when the test ends, and waits until it
// is up.
func openStoreThrough(t *testing.T, p *redistest.FaultProxy, timeout time.Duration) *store.Store {
	t.Helper()
	st, err := store.OpenStore(store.StoreOptions{RedisURL: p.URL(), Timeout: timeout, ProbeInterval: 20 * time.Millisecond,
		Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	waitFor(t, "redis to be up", st.Up)
	return st
}

// slidingCounts is what Redis counts in the current and the previous
// period of policy's sliding window of subject.
func slidingCounts(t *testing.T, r *redistest.Server, policyName, subject string) (cur, prev int64) {
	t.Helper()
	fields, err := r.Do(t, "HMGET", luascript.SlidingWindowKey("qt:", policyName, subject), "c", "p").AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	cur, _ = strconv.ParseInt(fields[0], 10, 64)
	prev, _ = strconv.ParseInt(fields[1], 10, 64)
	return cur, prev
}

// A take of a policy with an allotment is answered from memory once a
// reservation covers it, and says so; a take with a request_id, a peek
// and a take of several checks go to Redis as before.
func TestAllotmentAnswersLocally(t *testing.T) {
	r := redistest.Start(t)
	d, _ := newAllotDispatcher(t, r, "1m")
	take := `{"op":"take","policy":"hot","subject":"a"}`
	// A key turns hot once its rate would fill a reservation.
	n := 0
	waitFor(t, "a take answered from the allotment", func() bool {
		n++
		return decide(t, d, take).Allotted
	})
	for i := range 20 {
		o := decide(t, d, take)
		if !o.Allowed || !o.Allotted || o.Used+o.Remaining != 1000 {
			t.Fatalf("take %d = %+v", i, o)
		}
		line := render(&o)
		if !strings.Contains(line, `,"local":true}`) {
			t.Fatalf("reply %s does not say local", line)
		}
	}
	if got := counterOf(t, d.allot.m.local, "hot"); got < 21 {
		t.Fatalf("%v local decisions counted, want at least 21", got)
	}
	reserved := counterOf(t, d.allot.m.reserved, "hot")
	if used := redisUsed(t, r, "hot", "a"); used < int64(n+20) || float64(used) > reserved+float64(n) {
		t.Fatalf("redis used %d after %d takes, %v reserved: every unit handed out was reserved first", used, n+20, reserved)
	}

	for _, line := range []string{
		`{"op":"take","policy":"hot","subject":"a","request_id":"r1"}`,
		`{"op":"take","checks":[{"policy":"hot","subject":"a"},{"policy":"hot","subject":"b"}]}`,
	} {
		if o := decide(t, d, line); !o.Allowed || o.Allotted {
			t.Fatalf("%s = %+v, want decided by Redis", line, o)
		}
	}
	if o := decide(t, d, `{"op":"peek","policy":"hot","subject":"a"}`); o.Failed() || o.Allotted {
		t.Fatalf("peek = %+v", o)
	}
	// The reservation's script was loaded when its first call found it
	// missing, as a script a node lost is: no call carried its text.
	if n := r.CommandCalls(t, "eval"); n != 0 {
		t.Fatalf("%d EVAL calls, want none", n)
	}
}

// Fifty concurrent callers on one key never get more than the limit
// allowed, for every algorithm with allotments, and once they are done
// and the allotment is given back, Redis counts exactly what was allowed.
func TestAllotmentNeverOverTheLimit(t *testing.T) {
	r := redistest.Start(t)
	d, _ := newAllotDispatcher(t, r, "20ms")
	for _, p := range []string{"hot", "month", "slide", "bucket"} {
		t.Run(p, func(t *testing.T) {
			var allowed, local atomic.Int64
			var wg sync.WaitGroup
			for c := range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 40 {
						o := decide(t, d, `{"op":"take","policy":"`+p+`","subject":"x","cost":`+strconv.Itoa(1+c%2)+`}`)
						if o.Failed() {
							t.Errorf("take failed: %+v", o)
							return
						}
						if o.Allowed {
							allowed.Add(int64(1 + c%2))
						}
						if o.Allotted {
							local.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if allowed.Load() > 1000 {
				t.Fatalf("%d units allowed, over the limit of 1000", allowed.Load())
			}
			if local.Load() == 0 {
				t.Fatal("no take was answered from the allotment")
			}
			waitFor(t, "the allotment to be given back", func() bool {
				o := decide(t, d, `{"op":"peek","policy":"`+p+`","subject":"x"}`)
				return o.Used == allowed.Load() && gaugeOf(t, d.allot.m.held, p) == 0
			})
			if lost := counterOf(t, d.allot.m.lost, p); lost != 0 {
				t.Fatalf("%v units lost", lost)
			}
		})
	}
}

// Units unused for idle go back, and a drain gives back what is held:
// Redis then counts exactly the takes allowed. A calendar window's go
// back to the period they were taken in.
func TestAllotmentGoesBack(t *testing.T) {
	r := redistest.Start(t)
	d, _ := newAllotDispatcher(t, r, "20ms")
	for range 5 {
		decide(t, d, `{"op":"take","policy":"hot","subject":"idle"}`)
	}
	waitFor(t, "the idle units to go back", func() bool { return redisUsed(t, r, "hot", "idle") == 5 })

	d2, _ := newAllotDispatcher(t, r, "1m")
	n := int64(0)
	waitFor(t, "units held", func() bool {
		for _, p := range []string{"hot", "month"} {
			if o := decide(t, d2, `{"op":"take","policy":"`+p+`","subject":"drain"}`); !o.Allowed {
				t.Fatalf("take = %+v", o)
			}
		}
		n++
		return gaugeOf(t, d2.allot.m.held, "hot") > 0 && gaugeOf(t, d2.allot.m.held, "month") > 0
	})
	if used := redisUsed(t, r, "hot", "drain"); used <= n {
		t.Fatalf("used %d before the drain of %d takes: the test wants units held", used, n)
	}
	d2.ReturnAllotments(context.Background())
	if used := redisUsed(t, r, "hot", "drain"); used != n {
		t.Fatalf("used %d after the drain, want the %d allowed", used, n)
	}
	if o := decide(t, d2, `{"op":"peek","policy":"month","subject":"drain"}`); o.Used != n {
		t.Fatalf("calendar peek after the drain = %+v, want used %d", o, n)
	}
}

// While Redis is down, held units are still handed out; then the
// policy's on_unavailable answers.
func TestAllotmentWhileRedisIsDown(t *testing.T) {
	r := redistest.Start(t)
	d, _ := newAllotDispatcher(t, r, "1m")
	decide(t, d, `{"op":"take","policy":"open","subject":"a"}`)
	waitFor(t, "units held", func() bool {
		decide(t, d, `{"op":"take","policy":"hot","subject":"a"}`)
		return gaugeOf(t, d.allot.m.held, "hot") > 0
	})
	r.Stop(t)
	waitFor(t, "the store to see redis down", func() bool { return !d.store.Up() })
	if o := decide(t, d, `{"op":"take","policy":"hot","subject":"a"}`); !o.Allowed || !o.Allotted {
		t.Fatalf("take of a held unit with redis down = %+v", o)
	}
	// Cost beyond what is held: Redis must decide, and cannot.
	if o := decide(t, d, `{"op":"take","policy":"hot","subject":"a","cost":900}`); o.Code != "UNAVAILABLE" {
		t.Fatalf("take beyond the allotment with redis down = %+v, want UNAVAILABLE", o)
	}
	if o := decide(t, d, `{"op":"take","policy":"open","subject":"a","cost":900}`); !o.Degraded || !o.Allowed {
		t.Fatalf("take beyond the allotment, on_unavailable allow = %+v, want degraded", o)
	}
}

// The embedded store runs the reservations and returns as Redis does.
// (Its sliding window, whose arithmetic gopher-lua runs about a second a
// call on an hour's window, would outlast --redis-timeout; its reservation
// is tested against redis-server.)
func TestAllotmentOnTheEmbeddedStore(t *testing.T) {
	st, err := store.OpenStore(store.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	waitFor(t, "the embedded store to be up", st.Up)
	d := New(Options{Store: st, Config: allotConfig(t, "10ms"), Logger: zaptest.NewLogger(t), KeyPrefix: "qt:"})
	t.Cleanup(d.Close)
	for _, p := range []string{"hot", "month", "bucket"} {
		for range 5 {
			if o := decide(t, d, `{"op":"take","policy":"`+p+`","subject":"e","cost":2}`); !o.Allowed || o.Failed() {
				t.Fatalf("%s: take = %+v", p, o)
			}
		}
		waitFor(t, p+"'s units to go back", func() bool {
			return decide(t, d, `{"op":"peek","policy":"`+p+`","subject":"e"}`).Used == 10
		})
	}
}

// The control law asks for the takes waiting and a tenth of a second of
// the rate, at least the take's cost and at most the quota.
func TestAllotWant(t *testing.T) {
	for _, tc := range []struct {
		rate                       float64
		waiting, cost, quota, want int64
	}{
		{0, 1, 1, 1000, 1},           // no rate yet: the take itself
		{0, 7, 2, 1000, 7},           // and those waiting
		{1000, 1, 1, 1000, 101},      // 100 ms of 1000 a second
		{0.5, 1, 1, 1000, 2},         // a fraction of a unit is a unit
		{1e9, 1, 1, 1000, 1000},      // never more than the quota
		{0, 0, 3, 1000, 3},           // at least the cost
		{20_000, 4, 4, 50_000, 2004}, // a hot key
	} {
		if got := allotWant(tc.rate, tc.waiting, tc.cost, tc.quota); got != tc.want {
			t.Errorf("allotWant(%v, %d, %d, %d) = %d, want %d", tc.rate, tc.waiting, tc.cost, tc.quota, got, tc.want)
		}
	}
}

// The rate follows a burst at once and halves its distance at each
// sample.
func TestNextRate(t *testing.T) {
	r := nextRate(0, 100, 100*time.Millisecond)
	if r != 1000 {
		t.Fatalf("first sample: %v, want 1000", r)
	}
	if r = nextRate(r, 0, 100*time.Millisecond); r != 500 {
		t.Fatalf("after a lull: %v, want 500", r)
	}
	if r = nextRate(r, 300, 100*time.Millisecond); r != 1750 {
		t.Fatalf("after a burst: %v, want 1750", r)
	}
}

// The decision log marks a take answered from an allotment as local.
func TestAllotmentDecisionLogSaysLocal(t *testing.T) {
	r := redistest.Start(t)
	core, logs := observer.New(zapcore.InfoLevel)
	d := New(Options{Store: openStore(t, r), Config: allotConfig(t, "1m"), LogDecisions: LogDecisionsAll, Logger: zap.New(core), KeyPrefix: "qt:"})
	t.Cleanup(d.Close)
	waitFor(t, "a take answered from the allotment", func() bool {
		return decide(t, d, `{"op":"take","policy":"hot","subject":"log"}`).Allotted
	})
	lines := logs.FilterLoggerName("decision").All()
	if last := lines[len(lines)-1].ContextMap(); last[keyLocal] != true {
		t.Fatalf("decision log %v, want the last line local", last)
	}
	if first := lines[0].ContextMap(); first[keyLocal] != nil {
		t.Fatalf("decision log %v, want the first take (a cold key's) decided by redis", first)
	}
}

// A key turns hot within a few takes of a burst; takes a few a second,
// or two close together, leave it cold.
func TestObserveRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	hot := func(a *allot) bool { return a.rate*allotHorizon.Seconds() >= allotHotUnits }

	slow := &allot{rateFrom: t0}
	for i := range 20 {
		slow.observe(1, t0.Add(time.Duration(i)*200*time.Millisecond))
		if hot(slow) {
			t.Fatalf("5 units a second: hot after take %d (rate %v)", i+1, slow.rate)
		}
	}
	pair := &allot{rateFrom: t0}
	pair.observe(1, t0)
	pair.observe(1, t0.Add(time.Millisecond))
	if hot(pair) {
		t.Fatalf("two takes a ms apart: hot (rate %v)", pair.rate)
	}
	burst := &allot{rateFrom: t0}
	for i := range 5 {
		burst.observe(1, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if !hot(burst) {
		t.Fatalf("5 takes within 5 ms: cold (rate %v)", burst.rate)
	}
	big := &allot{rateFrom: t0}
	big.observe(20, t0)
	big.observe(5, t0.Add(300*time.Millisecond))
	if !hot(big) {
		t.Fatalf("20 units then a take 300 ms later: cold (rate %v)", big.rate)
	}
}

// A cold key's heat counter turns it hot when the units before a take
// come at 40 a second or more, over at least 100 ms, within a second.
func TestHeat(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var h heat
	if _, hot := h.warm(20, t0); hot {
		t.Fatal("a first take of 20 units: hot")
	}
	if _, hot := h.warm(5, t0.Add(400*time.Millisecond)); hot {
		t.Fatal("20 units 400 ms before: hot, want the hot rate kept up for a second")
	}
	if rate, hot := h.warm(20, t0.Add(500*time.Millisecond)); hot || rate != 50 {
		t.Fatalf("25 units in 500 ms: rate %v hot %v, want 50 and cold", rate, hot)
	}
	if rate, hot := h.warm(1, t0.Add(600*time.Millisecond)); !hot || rate != 75 {
		t.Fatalf("45 units in 600 ms: rate %v hot %v, want 75 and hot", rate, hot)
	}
	var slow heat
	for i := range 10 {
		if _, hot := slow.warm(1, t0.Add(time.Duration(i)*150*time.Millisecond)); hot {
			t.Fatalf("a unit every 150 ms: hot at take %d", i+1)
		}
	}
	var burst heat
	for i := range 5 {
		if _, hot := burst.warm(1, t0.Add(time.Duration(i)*time.Millisecond)); hot {
			t.Fatalf("5 takes within 5 ms: hot at take %d", i+1)
		}
	}
	var fast heat
	took := 0
	for hot := false; !hot; took++ {
		_, hot = fast.warm(1, t0.Add(time.Duration(took)*500*time.Microsecond))
	}
	if int64(took) != allotHeatUnits+1 {
		t.Fatalf("a take every 0.5 ms turned hot at take %d, want %d", took, allotHeatUnits+1)
	}
	// A second later the count starts again.
	if _, hot := fast.warm(1, t0.Add(2*time.Second)); hot {
		t.Fatal("after a lull: hot")
	}
}

// Keys taken a few times a second each stay cold, however many there
// are: a burst of a few takes on one of them is not a hot key.
func TestHeatManyColdKeys(t *testing.T) {
	as := &allotments{seed: maphash.MakeSeed()}
	rng := rand.New(rand.NewPCG(1, 2))
	const keys, perSecond, seconds = 10_000, 8, 3
	t0 := time.Unix(1000, 0)
	hot := map[string]bool{}
	for n := range keys * perSecond * seconds {
		at := t0.Add(time.Duration(n) * time.Second / (keys * perSecond))
		key := "qt:{wide:" + strconv.Itoa(rng.IntN(keys)) + "}"
		_, h := as.shard(key)
		if _, isHot := h.warm(1, at); isHot {
			hot[key] = true
		}
	}
	// Keys that share a counter add up, so a few turn hot (about 0.4%);
	// a rate measured over 100ms made about 15% of them hot.
	if len(hot) > keys/100 {
		t.Fatalf("%d of %d keys taken %d times a second each turned hot", len(hot), keys, perSecond)
	}
}

// A take answered from the allotment is a span that says so.
func TestAllotmentSpanSaysAllotted(t *testing.T) {
	r := redistest.Start(t)
	d, exp, _ := tracedDispatcher(t, r, allotConfig(t, "1m"))
	line, traceID, _ := traceParent(7)
	waitFor(t, "a take answered from the allotment", func() bool {
		return decide(t, d, `{"op":"take","policy":"hot","subject":"span",`+line+`}`).Allotted
	})
	spans := exp.GetSpans().Snapshots()
	var last sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() == traceID && s.Name() == "take" {
			last = s
		}
	}
	if last == nil {
		t.Fatalf("no take span in trace %s among %d spans", traceID, len(spans))
	}
	if got := attrsOf(last)[attrAllotted]; !got.AsBool() {
		t.Fatalf("the allotted take's span has quotad.allotted %v, want true", got.Emit())
	}
}

// A return whose reply is lost opens the breaker: it is kept and sent
// again once the breaker lets calls through, applied once, and its units
// are counted returned, not lost.
func TestAllotmentReturnSentAgainAfterTheBreakerCloses(t *testing.T) {
	const deadline = 300 * time.Millisecond
	r := redistest.Start(t)
	p := redistest.StartFaultProxy(t, r.Addr())
	st := openStoreThrough(t, p, deadline)
	d := New(Options{Store: st, Config: allotConfig(t, "1m"), Logger: zaptest.NewLogger(t), KeyPrefix: "qt:",
		Registry: prometheus.NewRegistry(), RedisTimeout: deadline})
	t.Cleanup(d.Close)

	// A return on another subject first: the sidecar checks that Redis
	// holds a script when it first sends it, and that check is not to be
	// held back.
	waitFor(t, "units held", func() bool {
		decide(t, d, `{"op":"take","policy":"hot","subject":"warm"}`)
		return gaugeOf(t, d.allot.m.held, "hot") > 0
	})
	d.ReturnAllotments(t.Context())
	returnedBefore := counterOf(t, d.allot.m.returned, "hot")

	var n int64
	waitFor(t, "units held", func() bool {
		if o := decide(t, d, `{"op":"take","policy":"hot","subject":"retried"}`); !o.Allowed {
			t.Fatalf("take = %+v", o)
		}
		n++
		return gaugeOf(t, d.allot.m.held, "hot") > 0
	})
	held := gaugeOf(t, d.allot.m.held, "hot")

	// Replies stop reaching the sidecar: the drain's return reaches
	// Redis, is applied, and its reply is lost.
	p.SetLatency(redistest.ToClient, time.Hour)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		d.ReturnAllotments(ctx)
	}()
	waitFor(t, "the return to be applied", func() bool { return redisUsed(t, r, "hot", "retried") == n })
	waitFor(t, "the breaker to open", func() bool { return !st.Up() })
	select {
	case <-drained:
		t.Fatal("the drain ended while the return's outcome was unknown and redis down")
	default:
	}
	p.SetLatency(redistest.ToClient, 0)
	p.Reset()
	<-drained

	if used := redisUsed(t, r, "hot", "retried"); used != n {
		t.Fatalf("used %d after the drain, want the %d allowed: the return was applied twice", used, n)
	}
	returned, lost := counterOf(t, d.allot.m.returned, "hot")-returnedBefore, counterOf(t, d.allot.m.lost, "hot")
	if returned != held || lost != 0 {
		t.Fatalf("%v held: %v counted returned, %v lost; want all returned", held, returned, lost)
	}
}

// Units a sliding window's sidecar holds when their period ends go back
// to that period, which still counts in the estimate, before the next
// reservation: Redis then counts exactly what was admitted.
func TestAllotmentSlidingPeriodEndGivesBack(t *testing.T) {
	const window = 2 * time.Second
	r := redistest.Start(t)
	cfg := edgeConfig(t, "2s")
	reg := prometheus.NewRegistry()
	d := New(Options{Store: openStore(t, r), Config: cfg, Logger: zaptest.NewLogger(t), KeyPrefix: "qt:", Registry: reg})
	t.Cleanup(d.Close)

	// Units held early in a period, then takes in the next one.
	time.Sleep(time.Until(time.Now().Truncate(window).Add(window + 50*time.Millisecond)))
	var n int64
	take := func() {
		t.Helper()
		if o := decide(t, d, `{"op":"take","policy":"edge","subject":"s"}`); !o.Allowed {
			t.Fatalf("take = %+v", o)
		}
		n++
	}
	waitFor(t, "units held", func() bool {
		take()
		return gaugeOf(t, d.allot.m.held, "edge") > 0
	})
	next := time.Now().Truncate(window).Add(window)
	time.Sleep(time.Until(next.Add(50 * time.Millisecond)))
	reservations := counterOf(t, d.allot.m.reservations, "edge")
	waitFor(t, "a reservation in the next period", func() bool {
		take()
		return counterOf(t, d.allot.m.reservations, "edge") > reservations
	})
	d.ReturnAllotments(context.Background())
	if time.Now().After(next.Add(window)) {
		t.Fatal("the drain ended after the next period: too late to compare")
	}

	c, p := slidingCounts(t, r, "edge", "s")
	if c+p != n {
		t.Errorf("redis counts %d (this period) + %d (the previous), %d were admitted", c, p, n)
	}
	if lost := counterOf(t, d.allot.m.lost, "edge"); lost != 0 {
		t.Errorf("%v units counted lost", lost)
	}
	if returned := counterOf(t, d.allot.m.returned, "edge"); returned == 0 {
		t.Error("nothing counted returned")
	}
}

// A reservation granted just before a sliding window's period ends may
// be answered after it, with takes waiting for it: its units can no
// longer be handed out, and go back to the period they count in before
// the next reservation, not lost. Replies reach the sidecar late (the
// proxy delays them) across the end while takes keep coming; after the
// drain Redis counts exactly what was admitted.
func TestAllotmentSlidingReplyAfterThePeriodEnd(t *testing.T) {
	const (
		window  = 4 * time.Second
		late    = 400 * time.Millisecond
		timeout = 3 * time.Second
	)
	r := redistest.Start(t)
	p := redistest.StartFaultProxy(t, r.Addr())
	st := openStoreThrough(t, p, timeout)
	cfg := edgeConfig(t, "4s")
	d := New(Options{Store: st, Config: cfg, Logger: zaptest.NewLogger(t), KeyPrefix: "qt:",
		Registry: prometheus.NewRegistry(), RedisTimeout: timeout})
	t.Cleanup(d.Close)

	// Units held with time left in the period: the key turns hot within
	// about a second of takes.
	if end := time.Now().Truncate(window).Add(window); time.Until(end) < 2500*time.Millisecond {
		time.Sleep(time.Until(end.Add(50 * time.Millisecond)))
	}
	var admitted, refused atomic.Int64
	take := func() {
		var req protocol.Request
		if err := protocol.Decode([]byte(`{"op":"take","policy":"edge","subject":"s"}`), &req); err != nil {
			panic(err)
		}
		done := make(chan struct{})
		dec := &Decision{Done: func() { close(done) }}
		if _, decided := d.Prepare(&req, dec); !decided {
			d.Run(dec)
		}
		<-done
		if dec.Out.Allowed {
			admitted.Add(1)
		} else {
			refused.Add(1)
		}
	}
	waitFor(t, "units held", func() bool {
		take()
		return gaugeOf(t, d.allot.m.held, "edge") > 0
	})
	end := time.Now().Truncate(window).Add(window)
	if time.Until(end) < late {
		t.Fatalf("units held %v before the period ends: too late to start", time.Until(end))
	}

	// From late before the end, replies take late to come back; takes
	// come from 8 callers until late after it.
	time.Sleep(time.Until(end.Add(-late)))
	reservations := counterOf(t, d.allot.m.reservations, "edge")
	p.SetLatency(redistest.ToClient, late)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end.Add(late)) {
				take()
			}
		}()
	}
	time.Sleep(time.Until(end))
	p.SetLatency(redistest.ToClient, 0)
	wg.Wait()
	if counterOf(t, d.allot.m.reservations, "edge") == reservations {
		t.Fatal("no reservation across the period's end")
	}
	d.ReturnAllotments(context.Background())
	if time.Now().After(end.Add(window)) {
		t.Fatal("the drain ended after the next period: too late to compare")
	}

	c, prev := slidingCounts(t, r, "edge", "s")
	lost, returned := counterOf(t, d.allot.m.lost, "edge"), counterOf(t, d.allot.m.returned, "edge")
	t.Logf("admitted %d, refused %d; redis counts %d + %d; returned %v, lost %v", admitted.Load(), refused.Load(), c, prev, returned, lost)
	if refused.Load() != 0 {
		t.Errorf("%d takes refused under a limit far from reached", refused.Load())
	}
	if c+prev != admitted.Load() || lost != 0 {
		t.Errorf("redis counts %d (this period) + %d (the previous), %d were admitted; %v units counted lost",
			c, prev, admitted.Load(), lost)
	}
}

// A return waiting for Redis to answer again gives up at the drain's
// deadline: its units are counted lost, and Close leaves nothing running
// (goleak, in TestMain).
func TestAllotmentPendingReturnGivesUpAtTheDrainsDeadline(t *testing.T) {
	r := redistest.Start(t)
	d, _ := newAllotDispatcher(t, r, "1m")
	waitFor(t, "units held", func() bool {
		decide(t, d, `{"op":"take","policy":"hot","subject":"down"}`)
		return gaugeOf(t, d.allot.m.held, "hot") > 0
	})
	held := gaugeOf(t, d.allot.m.held, "hot")
	r.Stop(t)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	d.ReturnAllotments(ctx)
	if ctx.Err() == nil {
		t.Fatal("the drain ended before its deadline with redis down")
	}
	d.Close()
	returned, lost := counterOf(t, d.allot.m.returned, "hot"), counterOf(t, d.allot.m.lost, "hot")
	if returned != 0 || lost != held {
		t.Fatalf("%v held: %v counted returned, %v lost; want all lost", held, returned, lost)
	}
}
