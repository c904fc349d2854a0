package dispatch

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// Decision log levels (--log-decisions).
const (
	LogDecisionsNone   = "none"
	LogDecisionsDenied = "denied"
	LogDecisionsAll    = "all"
)

// ValidateLogDecisions validates a --log-decisions value.
func ValidateLogDecisions(v string) error {
	switch v {
	case "", LogDecisionsNone, LogDecisionsDenied, LogDecisionsAll:
		return nil
	}
	return fmt.Errorf("--log-decisions %q: want none, denied or all", v)
}

// Log keys of the dispatcher's lines, documented in docs/operations.md.
const (
	keyOp          = "op"
	keyAlgorithm   = "algorithm"
	keyPolicy      = "policy"
	keySubject     = "subject"
	keyCost        = "cost"
	keyVerdict     = "verdict"
	keyLimit       = "limit"
	keyUsed        = "used"
	keyRemaining   = "remaining"
	keyRequestID   = "request_id"
	keyLocal       = "local"
	keyLatencyUS   = "latency_us"
	keyKey         = "key"
	keyHealedTotal = "healed_total"
	keyCheck       = "check" // a check's place in its take, from 1
	keyNode        = "redis_node"
	keyWhy         = "why"
	keyScripts     = "scripts"
	keyBytes       = "bytes"
)

// decisionSampling bounds the decision log: in each second, the first
// `first` lines are written and then one in `thereafter`, so a flood of
// denials cannot drown the node's log pipeline. The metrics count every
// decision.
var decisionSampling = struct{ first, thereafter int }{first: 100, thereafter: 100}

// metrics are the dispatcher's Prometheus collectors, registered on the
// server's registry. No subject is ever a label value.
type metrics struct {
	d             *Dispatcher
	decisions     *prometheus.CounterVec
	requests      *prometheus.CounterVec
	localDenials  prometheus.Counter
	duration      *prometheus.HistogramVec
	redisDuration prometheus.Histogram
	queueDuration *waits
	batchSize     prometheus.Histogram
	redisErrors   *prometheus.CounterVec
	scriptLoads   *prometheus.CounterVec
	inflight      prometheus.Gauge
	logDropped    prometheus.Counter

	// The children of the vectors above that decisions count in, by label
	// values; the cells hold those of the common labels (an op, a result
	// that is not an error code, an algorithm of inline limits), found by
	// index without hashing a label.
	decisionsOf series[[3]string, prometheus.Counter]
	requestsOf  series[[2]string, prometheus.Counter]
	durationOf  series[string, prometheus.Observer]
	durationAt  [numOps]cell[prometheus.Observer]
	requestAt   [numOps][len(resultLabels)]cell[prometheus.Counter]
	inlineAt    [len(algorithmLabels)][len(resultLabels)]cell[prometheus.Counter]

	// decisionLog is nil when decisions are not logged; logAll logs allowed
	// takes and errors too, not only denials.
	decisionLog *zap.Logger
	logAll      bool

	client atomic.Pointer[timedClient]
}

func newMetrics(d *Dispatcher, opts Options) *metrics {
	m := &metrics{d: d}
	latency := prometheus.ExponentialBuckets(0.0001, 2, 15) // 100µs to 1.6s
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotad_decisions_total",
		Help: "Takes by policy (\"\" for inline limits), algorithm and result: allowed, denied, replay, degraded, shadow_allowed, shadow_denied, or the error code.",
	}, []string{"policy", "algorithm", "result"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotad_requests_total",
		Help: "Requests by op and result: a take's as in quotad_decisions_total, ok for a peek or ping, released or not_held for a release, settled, replay or not_settled for a settle, or the error code.",
	}, []string{"op", "result"})
	m.localDenials = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quotad_local_denials_total",
		Help: "Takes denied by the sidecar from an earlier answer of Redis, without a Redis call.",
	})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "quotad_request_duration_seconds",
		Help:    "Time from a decoded request to its reply, by op.",
		Buckets: latency,
	}, []string{"op"})
	m.redisDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "quotad_redis_call_duration_seconds",
		Help:    "Time of each Redis command the requests send (EVALSHA, and EVAL when a script was missing).",
		Buckets: latency,
	})
	m.queueDuration = newWaits("quotad_redis_queue_seconds",
		"Time each decision sent to Redis waited inside quotad, from its arrival to the send of its script call: behind the batches at Redis. Its deadline counts from its arrival; only the rest is time at Redis.",
		latency)
	m.batchSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "quotad_redis_batch_requests",
		Help:    "Decisions sent to Redis together, per batch: those that came while earlier batches were at Redis.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 9), // 1 to 256
	})
	m.redisErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotad_redis_errors_total",
		Help: "Redis commands that failed, by kind: timeout, connection, refused (LOADING, READONLY, OOM and the like, counting each decision of a batch script call Redis refused so).",
	}, []string{"kind"})
	m.scriptLoads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotad_script_loads_total",
		Help: "Scripts the sidecar loaded into Redis (SCRIPT LOAD), by why: connect (a node it connected to lacked them) or noscript (a call found one missing, after a SCRIPT FLUSH).",
	}, []string{"why"})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quotad_inflight_requests",
		Help: "Requests being answered now.",
	})
	m.logDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quotad_decision_log_dropped_total",
		Help: "Decision log lines the sampler dropped.",
	})
	m.decisionsOf.of = func(l [3]string) prometheus.Counter { return m.decisions.WithLabelValues(l[0], l[1], l[2]) }
	m.requestsOf.of = func(l [2]string) prometheus.Counter { return m.requests.WithLabelValues(l[0], l[1]) }
	m.durationOf.of = func(op string) prometheus.Observer { return m.duration.WithLabelValues(op) }
	if opts.Registry != nil {
		opts.Registry.MustRegister(m.decisions, m.requests, m.localDenials, m.duration, m.redisDuration, m.queueDuration, m.batchSize,
			m.redisErrors, m.scriptLoads, m.inflight, m.logDropped,
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "quotad_healed_keys_total",
				Help: "Quota keys found without a TTL and given one back.",
			}, func() float64 { return float64(d.Healed()) }))
	}
	// Series that exist from the start, so a dashboard shows 0, not nothing.
	for _, k := range []string{"timeout", "connection", "refused"} {
		m.redisErrors.WithLabelValues(k)
	}
	for _, why := range []string{luascript.LoadConnect, luascript.LoadNoScript} {
		m.scriptLoads.WithLabelValues(why)
	}
	if opts.LogDecisions == LogDecisionsDenied || opts.LogDecisions == LogDecisionsAll {
		m.logAll = opts.LogDecisions == LogDecisionsAll
		hook := zapcore.SamplerHook(func(_ zapcore.Entry, s zapcore.SamplingDecision) {
			if s&zapcore.LogDropped != 0 {
				m.logDropped.Inc()
			}
		})
		m.decisionLog = opts.Logger.Named("decision").WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Second, decisionSampling.first, decisionSampling.thereafter, hook)
		}))
	}
	return m
}

// series memoizes the children of a metric vector by their label values:
// WithLabelValues checks and hashes the values on every call, which at a
// decision every few microseconds shows in a profile. The label values are
// bounded (ops, results, algorithms, configured policies), and so is the
// map.
type series[K comparable, M any] struct {
	m  sync.Map // K to M
	of func(K) M
}

func (s *series[K, M]) get(k K) M {
	if v, ok := s.m.Load(k); ok {
		return v.(M)
	}
	v, _ := s.m.LoadOrStore(k, s.of(k))
	return v.(M)
}

// cell holds one memoized child, made at its first use.
type cell[M any] struct{ p atomic.Pointer[M] }

// get is the child in c, made by of at the first call; every caller gets
// the one stored first.
func (c *cell[M]) get(of func() M) M {
	if p := c.p.Load(); p != nil {
		return *p
	}
	m := of()
	c.p.CompareAndSwap(nil, &m)
	return *c.p.Load()
}

// numOps bounds protocol.Op, for the cells indexed by op.
const numOps = int(protocol.OpSettle) + 1

// resultLabels are the results counted but the error codes, the most
// common first: a result's index here is its cells' (labelIndex).
var resultLabels = [...]string{ResultAllowed, ResultDenied, ResultOK, ResultReplay, ResultDegraded, ResultShadowAllowed,
	ResultShadowDenied, ResultReleased, ResultNotHeld, ResultSettled, ResultNotSettled, ResultUnapplied, ResultSkipped}

// algorithmLabels are the algorithms' names, for the cells of inline
// limits' decisions.
var algorithmLabels = [...]string{limits.FixedWindow, limits.SlidingWindow, limits.TokenBucket, limits.Concurrency, limits.Calendar}

// labelIndex is the index of label in labels, -1 when it is not there.
// The labels compared are constants, mostly the same strings.
func labelIndex(labels []string, label string) int {
	for i, l := range labels {
		if l == label {
			return i
		}
	}
	return -1
}

// latency is op's latency histogram.
func (m *metrics) latency(op protocol.Op) prometheus.Observer {
	name := op.String()
	if int(op) >= numOps {
		return m.durationOf.get(name)
	}
	return m.durationAt[op].get(func() prometheus.Observer { return m.durationOf.get(name) })
}

// request is the counter of requests of op with result.
func (m *metrics) request(op protocol.Op, result string) prometheus.Counter {
	r := labelIndex(resultLabels[:], result)
	if int(op) >= numOps || r < 0 {
		return m.requestsOf.get([2]string{op.String(), result})
	}
	return m.requestAt[op][r].get(func() prometheus.Counter { return m.requestsOf.get([2]string{op.String(), result}) })
}

// decision is the counter of checks of policy ("" for inline limits) and
// algorithm with result.
func (m *metrics) decision(policy, algorithm, result string) prometheus.Counter {
	if policy == "" {
		a, r := labelIndex(algorithmLabels[:], algorithm), labelIndex(resultLabels[:], result)
		if a >= 0 && r >= 0 {
			return m.inlineAt[a][r].get(func() prometheus.Counter { return m.decisionsOf.get([3]string{policy, algorithm, result}) })
		}
	}
	return m.decisionsOf.get([3]string{policy, algorithm, result})
}

// observe records a finished decision: its latency, its result, and for a
// take its decision log line.
func (m *metrics) observe(dec *Decision) {
	m.inflight.Dec()
	elapsed := time.Since(dec.start)
	o := &dec.Out
	result := o.Result()
	observeLatency(m.latency(o.Op), dec, elapsed.Seconds())
	m.request(o.Op, result).Inc()
	if o.Op != protocol.OpTake {
		return
	}
	for i := range dec.checks {
		m.observeCheck(dec, i, elapsed)
	}
}

// observeCheck counts check i of a finished take, and logs it.
func (m *metrics) observeCheck(dec *Decision, i int, elapsed time.Duration) {
	o, oc, req := &dec.Out, dec.out(i), dec.checks[i].req
	result := oc.Result()
	switch {
	case o.Failed():
		result = string(o.Code)
	case oc.Skipped:
		result = ResultSkipped
	case !o.Allowed && !o.Degraded && !oc.Replay && oc.accepted():
		result = ResultUnapplied
	}
	// Only configured policy names become label values: a client naming
	// policies at random must not create series.
	policy := ""
	if g := dec.givenOf(i); g != nil {
		policy = g.Name
	} else if p := req.Policy; p != "" {
		if _, known := dec.cfg.Policies[p]; known {
			policy = p
		}
	}
	m.decision(policy, oc.Algorithm, result).Inc()
	if m.decisionLog == nil || !m.logAll && !o.Denied() {
		return
	}
	fields := make([]zap.Field, 0, 15)
	fields = append(fields, zap.String(keyOp, o.Op.String()))
	if dec.listed() {
		fields = append(fields, zap.Int(keyCheck, i+1))
	}
	fields = append(fields,
		zap.String(keyAlgorithm, oc.Algorithm),
		zap.String(keyPolicy, cmp.Or(policy, req.Policy)),
		zap.String(keySubject, req.Subject),
		zap.Int64(keyCost, req.Cost),
		zap.String(keyVerdict, result),
	)
	if !o.Failed() && !oc.Skipped {
		fields = append(fields, zap.Int64(keyLimit, oc.Limit), zap.Int64(keyUsed, oc.Used), zap.Int64(keyRemaining, oc.Remaining))
	}
	if dec.req.RequestID != "" {
		fields = append(fields, zap.String(keyRequestID, dec.req.RequestID))
	}
	if oc.Local || oc.Allotted {
		fields = append(fields, zap.Bool(keyLocal, true))
	}
	fields = append(fields, zap.Int64(keyLatencyUS, elapsed.Microseconds()))
	fields = append(fields, dec.traceLog()...)
	m.decisionLog.Info("decision", fields...)
}

// queued records how long each of decs, sent in one call, waited inside
// quotad before the call was sent (trip.sent).
func (m *metrics) queued(decs ...*Decision) { m.queueDuration.observe(decs...) }

// ObserveRefused counts a request the server refused itself, before the
// dispatcher saw it: a line that does not decode, one too long, one that
// came while draining.
func (d *Dispatcher) ObserveRefused(op protocol.Op, code protocol.Code) {
	d.metrics.request(op, string(code)).Inc()
}

// ObservePing counts a ping answered by the server, which started at start.
func (d *Dispatcher) ObservePing(start time.Time) {
	d.metrics.latency(protocol.OpPing).Observe(time.Since(start).Seconds())
	d.metrics.request(protocol.OpPing, ResultOK).Inc()
}

// instrument wraps the store's client so that every Redis command a
// decision sends is timed and its failures counted. The wrapper is reused
// while the store's client stays the same.
func (m *metrics) instrument(c rueidis.Client) rueidis.Client {
	if w := m.client.Load(); w != nil && w.Client == c {
		return w
	}
	w := &timedClient{Client: c, m: m}
	m.client.Store(w)
	return w
}

// timedClient is a rueidis.Client that observes Do and DoMulti; every other
// method goes to the wrapped client untouched.
type timedClient struct {
	rueidis.Client
	m *metrics
}

func (c *timedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	start := monoNow()
	res := c.Client.Do(ctx, cmd)
	c.m.redisCall(start, res.Error())
	return res
}

func (c *timedClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	start := monoNow()
	res := c.Client.DoMulti(ctx, cmds...)
	for _, r := range res {
		c.m.redisCall(start, r.Error())
		c.m.refusedInside(r)
	}
	return res
}

// refusedInside counts the decisions of a batch script call's reply that
// Redis refused (the OOM of a decision's first write): alone, each would
// have been its command's error.
func (m *metrics) refusedInside(r rueidis.RedisResult) {
	arr, err := r.ToArray()
	if err != nil {
		return
	}
	for i := range arr {
		if e := arr[i].Error(); e != nil && m.d.classify(e, nil).kind == "refused" {
			m.redisErrors.WithLabelValues("refused").Inc()
		}
	}
}

func (m *metrics) redisCall(start time.Time, err error) {
	m.redisDuration.Observe(time.Since(start).Seconds())
	if err == nil {
		return
	}
	if kind := m.d.classify(err, nil).kind; kind != "" {
		m.redisErrors.WithLabelValues(kind).Inc()
	}
}
