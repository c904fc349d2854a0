package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/rueidis"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"quotad/protocol"
)

// Decision log levels (--log-decisions).
const (
	LogDecisionsNone   = "none"
	LogDecisionsDenied = "denied"
	LogDecisionsAll    = "all"
)

// CheckLogDecisions validates a --log-decisions value.
func CheckLogDecisions(v string) error {
	switch v {
	case "", LogDecisionsNone, LogDecisionsDenied, LogDecisionsAll:
		return nil
	}
	return fmt.Errorf("--log-decisions %q: want none, denied or all", v)
}

// Results of a take, as the decisions metric and the decision log name
// them. An error reply is counted under its wire code (UNAVAILABLE, ...).
const (
	resultAllowed       = "allowed"
	resultDenied        = "denied"
	resultReplay        = "replay"
	resultDegraded      = "degraded"
	resultShadowAllowed = "shadow_allowed"
	resultShadowDenied  = "shadow_denied"
)

// decisionSampling bounds the decision log: in each second, the first
// `first` lines are written and then one in `thereafter`, so a flood of
// denials cannot drown the node's log pipeline. The metrics count every
// decision.
var decisionSampling = struct{ first, thereafter int }{first: 100, thereafter: 100}

// metrics are one server's Prometheus collectors, in a registry of its own
// (a process may run several servers, as the tests do).
type metrics struct {
	reg           *prometheus.Registry
	decisions     *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	redisDuration prometheus.Histogram
	redisBatch    prometheus.Histogram
	redisErrors   *prometheus.CounterVec
	inflight      prometheus.Gauge
	reloads       *prometheus.CounterVec
	logDropped    prometheus.Counter

	// decisionLog is nil when decisions are not logged; logAll logs allowed
	// takes and errors too, not only denials.
	decisionLog *zap.Logger
	logAll      bool

	client atomic.Pointer[timedClient]
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	latency := prometheus.ExponentialBuckets(0.0001, 2, 15) // 100µs to 1.6s
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotad_decisions_total",
		Help: "Takes by policy (\"\" for inline limits) and result: allowed, denied, replay, degraded, shadow_allowed, shadow_denied, or the error code.",
	}, []string{"policy", "result"})
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
	m.redisBatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "quotad_redis_batch_requests",
		Help:    "Fixed-window takes and peeks sent to Redis together, per batch: those a connection sent at once, or those of one-request-at-a-time clients that came while earlier batches were at Redis.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 9), // 1 to 256
	})
	m.redisErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotad_redis_errors_total",
		Help: "Redis commands that failed, by kind: timeout, connection, refused (LOADING, READONLY, OOM and the like).",
	}, []string{"kind"})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quotad_inflight_requests",
		Help: "Requests being answered now.",
	})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotad_config_reloads_total",
		Help: "Policy file reloads, by result: ok or failed (the config in use was kept).",
	}, []string{"result"})
	m.logDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quotad_decision_log_dropped_total",
		Help: "Decision log lines the sampler dropped.",
	})
	up := func() float64 {
		if s.store != nil && s.store.Up() {
			return 1
		}
		return 0
	}
	m.reg.MustRegister(m.decisions, m.duration, m.redisDuration, m.redisBatch, m.redisErrors, m.inflight, m.reloads, m.logDropped,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "quotad_redis_up",
			Help: "1 when Redis answered the last call or probe; 0 when it is down (the breaker is open) or not reached yet.",
		}, up),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "quotad_connections",
			Help: "Open client connections.",
		}, func() float64 { return float64(s.Conns()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "quotad_healed_keys_total",
			Help: "Quota keys found without a TTL and given one back.",
		}, func() float64 { return float64(s.Healed()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "quotad_build_info",
			Help:        "Always 1; the version label says which quotad runs.",
			ConstLabels: prometheus.Labels{"version": s.opts.Version},
		}, func() float64 { return 1 }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newNodeUpCollector(s),
	)
	// Series that exist from the start, so a dashboard shows 0, not nothing.
	for _, r := range []string{"ok", "failed"} {
		m.reloads.WithLabelValues(r)
	}
	for _, k := range []string{"timeout", "connection", "refused"} {
		m.redisErrors.WithLabelValues(k)
	}
	if s.opts.LogDecisions == LogDecisionsDenied || s.opts.LogDecisions == LogDecisionsAll {
		m.logAll = s.opts.LogDecisions == LogDecisionsAll
		hook := zapcore.SamplerHook(func(_ zapcore.Entry, d zapcore.SamplingDecision) {
			if d&zapcore.LogDropped != 0 {
				m.logDropped.Inc()
			}
		})
		m.decisionLog = s.opts.Logger.Named("decision").WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Second, decisionSampling.first, decisionSampling.thereafter, hook)
		}))
	}
	return m
}

// beginRequest counts a request in flight and returns its start time; the
// deferred observeRequest ends it.
func (s *Server) beginRequest() time.Time {
	s.metrics.inflight.Inc()
	return time.Now()
}

// observeRequest records a finished request: its latency, and for a take
// the decision and its log line. It reads the result back from the reply
// line (from offset on in *out), so that every path that answers a take,
// whatever algorithm or fallback wrote it, is counted the same way.
func (s *Server) observeRequest(req *protocol.Request, start time.Time, offset int, out *[]byte) {
	m := s.metrics
	m.inflight.Dec()
	elapsed := time.Since(start)
	m.duration.WithLabelValues(req.Op.String()).Observe(elapsed.Seconds())
	if req.Op != protocol.OpTake || offset > len(*out) {
		return
	}
	result, used, ok := classify((*out)[offset:], len(req.ID))
	// Only configured policy names become label values: a client naming
	// policies at random must not create series.
	policy := ""
	if req.Policy != "" {
		if _, known := s.cfg.Load().Policies[req.Policy]; known {
			policy = req.Policy
		}
	}
	m.decisions.WithLabelValues(policy, result).Inc()
	if m.decisionLog == nil {
		return
	}
	denied := result == resultDenied || result == resultShadowDenied ||
		result == resultDegraded && (bytes.Contains((*out)[offset:], []byte(`"allowed":false`)) || bytes.Contains((*out)[offset:], []byte(`"shadow_allowed":false`)))
	if !denied && !m.logAll {
		return
	}
	fields := []zap.Field{
		zap.String(keyPolicy, req.Policy),
		zap.String(keySubject, req.Subject),
		zap.Int64(keyCost, req.Cost),
		zap.String(keyVerdict, result),
	}
	if ok {
		fields = append(fields, zap.Int64(keyUsed, used))
	}
	if req.RequestID != "" {
		fields = append(fields, zap.String(keyRequestID, req.RequestID))
	}
	fields = append(fields, zap.Duration(keyLatency, elapsed))
	m.decisionLog.Info("decision", fields...)
}

// classify reads a take's reply line: the result, and used when the reply
// is not an error. idLen is the length of the echoed id, skipped so that an
// id's bytes are never mistaken for fields.
func classify(reply []byte, idLen int) (result string, used int64, ok bool) {
	skip := 1 // "{"
	if idLen > 0 {
		skip += len(`"id":`) + idLen + 1
	}
	if skip > len(reply) {
		return "INTERNAL", 0, false
	}
	reply = reply[skip:]
	if bytes.HasPrefix(reply, []byte(`"ok":false`)) {
		code := field(reply, `"error":"`, '"')
		if code == "" {
			code = string(protocol.CodeInternal)
		}
		return code, 0, false
	}
	used = replyInt(reply, `"used":`)
	if rest, ok := bytes.CutPrefix(reply, []byte(takeHead)); ok {
		// AppendTake's layout: allowed and replay first, the shadow fields
		// and then degraded last. Read in place instead of searching the
		// whole line once per result (classify was 8% of the CPU of the
		// pipelined socket benchmark).
		allowed := bytes.HasPrefix(rest, []byte("true"))
		if allowed {
			rest = rest[len("true"):]
		} else {
			rest = bytes.TrimPrefix(rest, []byte("false"))
		}
		tail := bytes.TrimSuffix(reply, []byte("\n"))
		switch {
		case bytes.HasPrefix(rest, []byte(`,"replay":true`)):
			return resultReplay, used, true
		case bytes.HasSuffix(tail, []byte(`,"degraded":true}`)):
			return resultDegraded, used, true
		case bytes.HasSuffix(tail, []byte(`,"shadow_allowed":true}`)):
			return resultShadowAllowed, used, true
		case bytes.HasSuffix(tail, []byte(`,"shadow_allowed":false}`)):
			return resultShadowDenied, used, true
		case allowed:
			return resultAllowed, used, true
		}
		return resultDenied, used, true
	}
	switch {
	case bytes.Contains(reply, []byte(`"replay":true`)):
		result = resultReplay
	case bytes.Contains(reply, []byte(`"degraded":true`)):
		result = resultDegraded
	case bytes.Contains(reply, []byte(`"shadow_allowed":true`)):
		result = resultShadowAllowed
	case bytes.Contains(reply, []byte(`"shadow_allowed":false`)):
		result = resultShadowDenied
	case bytes.Contains(reply, []byte(`"allowed":true`)):
		result = resultAllowed
	default:
		result = resultDenied
	}
	return result, used, true
}

// takeHead is how every take reply AppendTake writes goes on after its id.
const takeHead = `"ok":true,"allowed":`

// replyInt returns the non-negative integer after key, or 0 when key is
// absent, without allocating.
func replyInt(b []byte, key string) int64 {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0
	}
	var n int64
	for _, c := range b[i+len(key):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// field returns the bytes after key up to end, or "" when key is absent.
func field(b []byte, key string, end byte) string {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return ""
	}
	b = b[i+len(key):]
	if j := bytes.IndexByte(b, end); j >= 0 {
		return string(b[:j])
	}
	return ""
}

// countReload records the outcome of a policy file reload.
func (s *Server) countReload(err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	s.metrics.reloads.WithLabelValues(result).Inc()
}

// instrument wraps the store's client so that every Redis command the
// request sends is timed and its failures counted. The wrapper is reused
// while the store's client stays the same.
func (s *Server) instrument(c rueidis.Client) rueidis.Client {
	if w := s.metrics.client.Load(); w != nil && w.Client == c {
		return w
	}
	w := &timedClient{Client: c, m: s.metrics}
	s.metrics.client.Store(w)
	return w
}

// timedClient is a rueidis.Client that observes Do and DoMulti; every other
// method goes to the wrapped client untouched.
type timedClient struct {
	rueidis.Client
	m *metrics
}

func (c *timedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	start := time.Now()
	res := c.Client.Do(ctx, cmd)
	c.m.redisCall(start, res.Error())
	return res
}

func (c *timedClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	start := time.Now()
	res := c.Client.DoMulti(ctx, cmds...)
	for _, r := range res {
		c.m.redisCall(start, r.Error())
	}
	return res
}

func (m *metrics) redisCall(start time.Time, err error) {
	m.redisDuration.Observe(time.Since(start).Seconds())
	if kind := redisErrorKind(err); kind != "" {
		m.redisErrors.WithLabelValues(kind).Inc()
	}
}

// redisErrorKind names a failed command for quotad_redis_errors_total, or
// "" when Redis answered: a script's own refusal (CONFLICT, POLICY...),
// WRONGTYPE and NOSCRIPT are answers, and a caller that gave up says nothing
// about Redis.
func redisErrorKind(err error) string {
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	if re, ok := rueidis.IsRedisErr(err); ok {
		msg := re.Error()
		for _, p := range transientReplies {
			if strings.HasPrefix(msg, p) {
				return "refused"
			}
		}
		return ""
	}
	return "connection"
}
