package dispatch

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
	"quotad/policy"
)

// tracedDispatcher is a dispatcher whose spans go to the returned
// exporter as each ends, and whose log lines (every decision's) to logs.
func tracedDispatcher(t *testing.T, r *redistest.Server, cfg *policy.Config) (*Dispatcher, *tracetest.InMemoryExporter, *observer.ObservedLogs) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	core, logs := observer.New(zapcore.InfoLevel)
	d := New(Options{Store: openStore(t, r), Config: cfg, AllowInline: true, KeyPrefix: "qt:",
		Logger: zap.New(core), LogDecisions: LogDecisionsAll, Tracer: tp})
	t.Cleanup(d.Close)
	return d, exp, logs
}

// traceParent is a traceparent of trace n, whose caller's span is n too.
func traceParent(n int) (line string, traceID trace.TraceID, parent trace.SpanID) {
	traceID[15], parent[7] = byte(n), byte(n)
	return fmt.Sprintf(`"traceparent":"00-%s-%s-01"`, traceID, parent), traceID, parent
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// Every op is a span under the caller's, with the attributes of its answer.
func TestTraceSpanOfEveryDecision(t *testing.T) {
	r := redistest.Start(t)
	cfg, err := policy.ParseConfig([]byte("policies:\n  api:\n    limit: 1\n    window: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	d, exp, _ := tracedDispatcher(t, r, cfg)
	conc := `"algorithm":"concurrency","limit":1,"lease_ms":60000`
	for n, tc := range []struct {
		line  string // without its closing brace
		attrs map[attribute.Key]any
		redis bool // a script call is its child
	}{
		{`{"op":"take","subject":"a","policy":"api","request_id":"r-1"`, map[attribute.Key]any{
			attrOp: "take", attrVerdict: "allowed", attrAlgorithm: "fixed_window", attrPolicy: "api", attrReplay: false, attrLocal: false}, true},
		{`{"op":"take","subject":"a","policy":"api","request_id":"r-1"`, map[attribute.Key]any{attrVerdict: "replay", attrReplay: true}, true},
		{`{"op":"take","subject":"a","policy":"api"`, map[attribute.Key]any{attrVerdict: "denied", attrLocal: false}, true},
		{`{"op":"take","subject":"a","policy":"api"`, map[attribute.Key]any{attrVerdict: "denied", attrLocal: true}, false},
		{`{"op":"peek","subject":"a","policy":"api"`, map[attribute.Key]any{attrOp: "peek", attrVerdict: "ok"}, true},
		{`{"op":"take","subject":"l","request_id":"lease-1",` + conc, map[attribute.Key]any{attrAlgorithm: "concurrency", attrPolicy: ""}, true},
		{`{"op":"release","subject":"l","request_id":"lease-1",` + conc, map[attribute.Key]any{attrOp: "release", attrVerdict: "released"}, true},
		{`{"op":"take","subject":"s","limit":5,"window_ms":60000,"cost":3,"request_id":"s-1"`, map[attribute.Key]any{attrVerdict: "allowed"}, true},
		{`{"op":"settle","subject":"s","limit":5,"window_ms":60000,"cost":1,"request_id":"s-1"`, map[attribute.Key]any{attrOp: "settle", attrVerdict: "settled"}, true},
		{`{"op":"take","checks":[{"subject":"c","policy":"api"},{"subject":"c","limit":5,"window_ms":60000}]`, map[attribute.Key]any{
			attrChecks: int64(2), attrAlgorithm: []string{"fixed_window", "fixed_window"}, attrPolicy: []string{"api", ""}}, true},
		{`{"op":"take","subject":"a","policy":"nope"`, map[attribute.Key]any{attrVerdict: "UNKNOWN_POLICY", attrErrorCode: "UNKNOWN_POLICY"}, false},
	} {
		tp, traceID, parent := traceParent(n + 1)
		line := tc.line + "," + tp + "}"
		decide(t, d, line)
		var span sdktrace.ReadOnlySpan
		for _, s := range exp.GetSpans().Snapshots() {
			if s.SpanContext().TraceID() == traceID && s.Parent().SpanID() == parent {
				span = s
			}
		}
		if span == nil {
			t.Fatalf("%s: no span under the caller's", line)
		}
		if span.SpanKind() != trace.SpanKindServer || span.Name() != attrsOf(span)[attrOp].AsString() || !span.Parent().IsRemote() {
			t.Errorf("%s: span %q of kind %v", line, span.Name(), span.SpanKind())
		}
		got := attrsOf(span)
		for k, want := range tc.attrs {
			if v, ok := got[k]; !ok || fmt.Sprint(v.AsInterface()) != fmt.Sprint(want) {
				t.Errorf("%s: attribute %s = %v, want %v", line, k, v.AsInterface(), want)
			}
		}
		if failed := span.Status().Code == codes.Error; failed != (got[attrErrorCode].AsString() != "") {
			t.Errorf("%s: status %v with error code %q", line, span.Status(), got[attrErrorCode].AsString())
		}
		children := 0
		for _, s := range exp.GetSpans().Snapshots() {
			if s.Parent().SpanID() == span.SpanContext().SpanID() {
				children++
				if s.Name() != "EVALSHA" || s.SpanKind() != trace.SpanKindClient || s.SpanContext().TraceID() != traceID {
					t.Errorf("%s: child span %q of kind %v", line, s.Name(), s.SpanKind())
				}
			}
		}
		if want := map[bool]int{true: 1, false: 0}[tc.redis]; children != want {
			t.Errorf("%s: %d script call spans under it, want %d", line, children, want)
		}
		exp.Reset()
	}
}

// The error and warning lines of a decision name its trace, and a
// degraded answer says so on its span.
func TestTraceLogsAndDegraded(t *testing.T) {
	r := redistest.Start(t)
	cfg, err := policy.ParseConfig([]byte("policies:\n  open:\n    limit: 5\n    window: 1m\n    on_unavailable: allow\n"))
	if err != nil {
		t.Fatal(err)
	}
	d, exp, logs := tracedDispatcher(t, r, cfg)
	// A key without a TTL: the take restores one, and warns.
	r.Do(t, "HSET", "qt:fw:{p:open:healed}", "used", "0", "policy", "5:60000", "ids", "0")
	tp, traceID, _ := traceParent(1)
	if o := decide(t, d, `{"op":"take","subject":"healed","policy":"open",`+tp+`}`); !o.Allowed {
		t.Fatalf("take: %+v", o)
	}
	take := exp.GetSpans().Snapshots()
	var spanID trace.SpanID
	for _, s := range take {
		if s.Name() == "take" {
			spanID = s.SpanContext().SpanID()
		}
	}
	for _, msg := range []string{"restored the TTL of a quota key that had none", "decision"} {
		lines := logs.FilterMessage(msg).All()
		if len(lines) != 1 {
			t.Fatalf("%d lines %q, want 1", len(lines), msg)
		}
		if f := lines[0].ContextMap(); f[keyTraceID] != traceID.String() || f[keySpanID] != spanID.String() {
			t.Errorf("%q: trace_id %v span_id %v, want %s %s", msg, f[keyTraceID], f[keySpanID], traceID, spanID)
		}
	}

	r.Stop(t)
	waitFor(t, "the store to see redis down", func() bool { return !d.store.Up() })
	exp.Reset()
	tp, _, _ = traceParent(2)
	if o := decide(t, d, `{"op":"take","subject":"b","policy":"open",`+tp+`}`); !o.Degraded || !o.Allowed {
		t.Fatalf("take with redis down: %+v", o)
	}
	spans := exp.GetSpans().Snapshots()
	if len(spans) != 1 || !attrsOf(spans[0])[attrDegraded].AsBool() || attrsOf(spans[0])[attrVerdict].AsString() != "degraded" {
		t.Errorf("the degraded take's spans: %v", spans)
	}
}
