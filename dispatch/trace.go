package dispatch

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"quotad/protocol"
)

// Tracing (docs/operations.md, "Traces"). With a tracer (Options.Tracer),
// every decision is a span, a child of the caller's span when the request
// carried a trace context (protocol/trace.go), and every script call to
// Redis is a span too:
//
//   - A call that carries one decision (a lone call, a take alone, a step
//     of a take in steps, a give back) is a child of that decision's span.
//   - A batch carries many decisions, of as many traces: its span is a
//     root, linked to every decision's span, and each decision's span
//     links back to it. It is sampled when any of them is (package
//     tracing's sampler).
//
// Without a tracer no span is made: the hot path pays one nil check per
// hook. Either way, a decision whose request carried a trace context (or
// whose span is sampled) names its trace in its log lines (trace_id,
// span_id) and in the exemplar of its latency.

// Log keys and exemplar labels of a decision's trace.
const (
	keyTraceID = "trace_id"
	keySpanID  = "span_id"
)

// Span attribute keys: a decision's, then a script call's.
const (
	attrOp         = attribute.Key("quotad.op")
	attrAlgorithm  = attribute.Key("quotad.algorithm")
	attrPolicy     = attribute.Key("quotad.policy")
	attrChecks     = attribute.Key("quotad.checks")
	attrVerdict    = attribute.Key("quotad.verdict")
	attrReplay     = attribute.Key("quotad.replay")
	attrLocal      = attribute.Key("quotad.local")
	attrAllotted   = attribute.Key("quotad.allotted")
	attrDegraded   = attribute.Key("quotad.degraded")
	attrErrorCode  = attribute.Key("quotad.error.code")
	attrErrorType  = attribute.Key("error.type")
	attrDBSystem   = attribute.Key("db.system.name")
	attrDBOp       = attribute.Key("db.operation.name")
	attrCall       = attribute.Key("quotad.call")
	attrDecisions  = attribute.Key("quotad.call.decisions")
	attrRedisError = attribute.Key("quotad.redis.error")
)

// Kinds of script call (attrCall), as route.go, batcher.go and steps.go
// send them.
const (
	callBatch    = "batch"
	callAlone    = "alone"
	callStep     = "step"
	callGiveBack = "give_back"
)

// tracerName names the instrumentation scope of quotad's spans.
const tracerName = "quotad/dispatch"

// startSpan starts dec's span, at dec.start: a child of the request's
// trace context when it carried one, else a root. Tracing is on.
func (d *Dispatcher) startSpan(dec *Decision) {
	ctx := context.Background()
	if sc := callerSpan(&dec.req.Trace); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	_, dec.span = d.tracer.Start(ctx, dec.req.Op.String(),
		trace.WithTimestamp(dec.start), trace.WithSpanKind(trace.SpanKindServer))
}

// callerSpan is the span context of a request's trace context; invalid
// when it carried none.
func callerSpan(t *protocol.Trace) trace.SpanContext {
	if !t.Valid() {
		return trace.SpanContext{}
	}
	cfg := trace.SpanContextConfig{
		TraceID: t.TraceID, SpanID: t.ParentID,
		TraceFlags: trace.TraceFlags(t.Flags) & trace.FlagsSampled, Remote: true,
	}
	if t.State != "" {
		// protocol validated it; the SDK's parser is the judge of what
		// it keeps.
		if ts, err := trace.ParseTraceState(t.State); err == nil {
			cfg.TraceState = ts
		}
	}
	return trace.NewSpanContext(cfg)
}

// endSpan writes dec's answer on its span and ends it. Tracing is on.
func (d *Dispatcher) endSpan(dec *Decision) {
	o := &dec.Out
	sp := dec.span
	if !sp.IsRecording() {
		// Not sampled: nothing of it is exported.
		sp.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, attrOp.String(o.Op.String()), attrVerdict.String(o.Result()))
	if dec.listed() {
		algorithms, policies := make([]string, len(dec.checks)), make([]string, len(dec.checks))
		for i := range dec.checks {
			algorithms[i], policies[i] = dec.out(i).Algorithm, dec.out(i).Policy
		}
		attrs = append(attrs, attrChecks.Int(len(dec.checks)),
			attrAlgorithm.StringSlice(algorithms), attrPolicy.StringSlice(policies))
	} else if o.Algorithm != "" {
		attrs = append(attrs, attrAlgorithm.String(o.Algorithm), attrPolicy.String(o.Policy))
	}
	attrs = append(attrs, attrReplay.Bool(o.Replay), attrLocal.Bool(o.Local), attrAllotted.Bool(o.Allotted), attrDegraded.Bool(o.Degraded))
	if o.Failed() {
		attrs = append(attrs, attrErrorCode.String(string(o.Code)), attrErrorType.String(string(o.Code)))
		sp.SetStatus(codes.Error, o.Message)
	}
	sp.SetAttributes(attrs...)
	sp.End()
}

// callSpan starts the span of a script call (of kind, callBatch ...) that
// carries decs; nil when tracing is off, or when none of decs is sampled:
// the call's span would not be either (the child of a span that is not,
// or a batch's span, which links only, package tracing's sampler).
// callEnded ends it.
func (d *Dispatcher) callSpan(kind string, decs ...*Decision) trace.Span {
	if d.tracer == nil || !anySampled(decs) {
		return nil
	}
	var sp trace.Span
	if len(decs) == 1 {
		_, sp = d.tracer.Start(trace.ContextWithSpan(context.Background(), decs[0].span), "EVALSHA",
			trace.WithSpanKind(trace.SpanKindClient))
	} else {
		links := make([]trace.Link, 0, len(decs))
		for _, dec := range decs {
			links = append(links, trace.Link{SpanContext: dec.span.SpanContext()})
		}
		_, sp = d.tracer.Start(context.Background(), "EVALSHA",
			trace.WithSpanKind(trace.SpanKindClient), trace.WithNewRoot(), trace.WithLinks(links...))
	}
	if !sp.IsRecording() {
		return sp
	}
	sp.SetAttributes(attrDBSystem.String("redis"), attrDBOp.String("EVALSHA"), attrCall.String(kind), attrDecisions.Int(len(decs)))
	if len(decs) > 1 {
		for _, dec := range decs {
			dec.span.AddLink(trace.Link{SpanContext: sp.SpanContext()})
		}
	}
	return sp
}

func anySampled(decs []*Decision) bool {
	for _, dec := range decs {
		if dec.span.SpanContext().IsSampled() {
			return true
		}
	}
	return false
}

// callEnded ends sp, the span of a script call that answered res (one
// result per decision it carried); an error of Redis's own (a timeout, a
// lost connection, a refusal), not a decision's answer, marks it failed.
func (d *Dispatcher) callEnded(sp trace.Span, res ...rueidis.RedisResult) {
	if sp == nil {
		return
	}
	if !sp.IsRecording() {
		sp.End()
		return
	}
	for _, r := range res {
		if err := r.Error(); err != nil {
			if kind := d.classify(err, nil).kind; kind != "" {
				sp.SetAttributes(attrRedisError.String(kind))
				sp.SetStatus(codes.Error, err.Error())
				break
			}
		}
	}
	sp.End()
}

// traceOf is the trace a decision's log lines and exemplar name: its
// span's when tracing is on (when the request carried a trace context, or
// the span is sampled), else the request's trace context. sampled says
// whether the trace is recorded, for the exemplar.
func (dec *Decision) traceOf() (sc trace.SpanContext, ok bool) {
	if dec.span != nil {
		sc = dec.span.SpanContext()
		return sc, dec.traced || sc.IsSampled()
	}
	if !dec.traced {
		return trace.SpanContext{}, false
	}
	return callerSpan(&dec.req.Trace), true
}

// traceLog are the log fields that name dec's trace; nil when none.
func (dec *Decision) traceLog() []zap.Field {
	sc, ok := dec.traceOf()
	if !ok {
		return nil
	}
	return []zap.Field{zap.Stringer(keyTraceID, sc.TraceID()), zap.Stringer(keySpanID, sc.SpanID())}
}

// observeLatency observes a decision's latency (s), with an exemplar of
// its trace when the trace is sampled.
func observeLatency(obs prometheus.Observer, dec *Decision, s float64) {
	if sc, ok := dec.traceOf(); ok && sc.IsSampled() {
		if eo, ok := obs.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(s, prometheus.Labels{keyTraceID: sc.TraceID().String()})
			return
		}
	}
	obs.Observe(s)
}
