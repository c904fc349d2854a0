package rls

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"quotad/protocol"
)

// Tracing: a call is a span ("ShouldRateLimit"), a child of the caller's
// span when the call's gRPC metadata carries a W3C traceparent (and
// tracestate), as Envoy sends them; the decisions of the call are spans
// inside it (dispatch/trace.go). Without a tracer, the caller's context
// still reaches the decisions, so their log lines name its trace.

// tracerName names the instrumentation scope of the calls' spans.
const tracerName = "quotad/rls"

// Span attribute keys of a call.
const (
	attrDomain      = attribute.Key("quotad.rls.domain")
	attrDescriptors = attribute.Key("quotad.rls.descriptors")
	attrOverall     = attribute.Key("quotad.rls.overall_code")
	attrGRPCCode    = attribute.Key("rpc.grpc.status_code")
)

// callerTrace is the trace context of the call's metadata; zero when it
// carries none or an invalid one, which is ignored, never an error.
// invalid reports that a traceparent or tracestate was ignored: malformed,
// all-zero ids, or given twice.
func callerTrace(ctx context.Context) (t protocol.Trace, invalid bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	tp, ts := md.Get("traceparent"), md.Get("tracestate")
	if len(tp) == 0 {
		return protocol.Trace{}, len(ts) > 0
	}
	t, ok := protocol.ParseTraceParent([]byte(tp[0]))
	if len(tp) != 1 || !ok {
		return protocol.Trace{}, true
	}
	switch {
	case len(ts) == 1 && protocol.ValidTraceState(ts[0]):
		t.State = ts[0]
	case len(ts) > 0:
		invalid = true
	}
	return t, invalid
}

// startSpan starts the call's span when tracing is on, and returns the
// trace context its decisions are children of.
func (s *Service) startSpan(ctx context.Context, req *rlsv3.RateLimitRequest, start time.Time) (protocol.Trace, trace.Span) {
	t, invalid := callerTrace(ctx)
	if invalid && s.traceInvalid != nil {
		s.traceInvalid()
	}
	if s.tracer == nil {
		return t, nil
	}
	parent := context.Background()
	if t.Valid() {
		cfg := trace.SpanContextConfig{TraceID: t.TraceID, SpanID: t.ParentID, TraceFlags: trace.TraceFlags(t.Flags) & trace.FlagsSampled, Remote: true}
		if t.State != "" {
			if ts, err := trace.ParseTraceState(t.State); err == nil {
				cfg.TraceState = ts
			}
		}
		parent = trace.ContextWithRemoteSpanContext(parent, trace.NewSpanContext(cfg))
	}
	_, span := s.tracer.Start(parent, "ShouldRateLimit", trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrDomain.String(req.GetDomain()), attrDescriptors.Int(len(req.GetDescriptors()))))
	sc := span.SpanContext()
	if !sc.IsValid() {
		return t, span
	}
	return protocol.Trace{TraceID: sc.TraceID(), ParentID: sc.SpanID(), Flags: byte(sc.TraceFlags()), State: sc.TraceState().String()}, span
}

// endSpan writes the call's answer on its span and ends it.
func endSpan(span trace.Span, resp *rlsv3.RateLimitResponse, err error) {
	if err != nil {
		st := status.Convert(err)
		span.SetAttributes(attrGRPCCode.Int(int(st.Code())))
		span.SetStatus(codes.Error, st.Message())
	} else {
		span.SetAttributes(attrOverall.String(resp.GetOverallCode().String()), attrGRPCCode.Int(0))
	}
	span.End()
}
