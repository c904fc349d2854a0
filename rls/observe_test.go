package rls_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/metadata"

	"quotad/integration/otlptest"
	"quotad/rls"
	"quotad/rls/descriptors"
	"quotad/tracing"
)

// A call sent with a traceparent in its gRPC metadata is a span under the
// caller's, and its take a span inside it, with its Redis call.
func TestTraceOfACall(t *testing.T) {
	recv := otlptest.Start(t)
	env := map[string]string{tracing.EnvEndpoint: recv.GRPCEndpoint(), tracing.EnvProtocol: tracing.ProtocolGRPC}
	tp, err := tracing.Start(context.Background(), tracing.Options{Version: "test", Getenv: func(k string) string { return env[k] }})
	if err != nil || tp == nil {
		t.Fatalf("tracing.Start: %v, %v", tp, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = tp.Shutdown(ctx)
	})
	e := setup(t, edge, apiPolicy, func(o *rls.ServiceOptions) { o.Tracer = tp })
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+traceID+"-"+parentID+"-01", "tracestate", "vendor=x")
	if _, err := e.client.ShouldRateLimit(ctx, request("edge", []string{"user", "t"}, []string{"path", "/login"})); err != nil {
		t.Fatal(err)
	}
	ctxf, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := tp.ForceFlush(ctxf); err != nil {
		t.Fatal(err)
	}
	find := func(spans []otlptest.Span, match func(otlptest.Span) bool) (otlptest.Span, bool) {
		for _, s := range spans {
			if match(s) {
				return s, true
			}
		}
		return otlptest.Span{}, false
	}
	isCall := func(s otlptest.Span) bool { return s.Name == "ShouldRateLimit" && s.TraceID == traceID }
	spans := recv.WaitFor(t, "the call's span, its take and the take's Redis call", waitTimeout, func(spans []otlptest.Span) bool {
		call, ok := find(spans, isCall)
		if !ok {
			return false
		}
		take, ok := find(spans, func(s otlptest.Span) bool { return s.ParentSpanID == call.SpanID })
		if !ok {
			return false
		}
		_, ok = find(spans, func(s otlptest.Span) bool { return s.ParentSpanID == take.SpanID })
		return ok
	})
	call, _ := find(spans, isCall)
	if call.ParentSpanID != parentID || call.Kind != tracepb.Span_SPAN_KIND_SERVER || call.Attributes["quotad.rls.domain"] != "edge" ||
		call.Attributes["quotad.rls.overall_code"] != "OK" {
		t.Errorf("call span: %+v", call)
	}
	take, _ := find(spans, func(s otlptest.Span) bool { return s.ParentSpanID == call.SpanID })
	if take.Name != "take" || take.TraceID != traceID || take.Attributes["quotad.checks"] != int64(2) {
		t.Errorf("take span: %+v", take)
	}
}

func TestResponseHeaders(t *testing.T) {
	e := setup(t, edge, apiPolicy, func(o *rls.ServiceOptions) { o.ResponseHeaders = true })
	resp := e.call(request("edge", []string{"user", "h"}))
	got := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		got[h.GetKey()] = h.GetValue()
	}
	if !strings.Contains(got["RateLimit-Policy"], `"rls:edge";q=3`) || !strings.Contains(got["RateLimit"], `"rls:edge";r=2;t=`) {
		t.Errorf("response_headers_to_add = %v, want the decision's RateLimit-Policy and RateLimit", resp.GetResponseHeadersToAdd())
	}
	for range 3 { // the limit is 3 a day: the last is over it
		resp = e.call(request("edge", []string{"user", "h"}))
	}
	got = map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		got[h.GetKey()] = h.GetValue()
	}
	if resp.GetOverallCode() != over || got["Retry-After"] == "" || !strings.Contains(got["RateLimit"], ";r=0;") {
		t.Errorf("over the limit: %v, want RateLimit r=0 and Retry-After", resp.GetResponseHeadersToAdd())
	}
	plain := setup(t, edge, apiPolicy)
	if hs := plain.call(request("edge", []string{"user", "h"})).GetResponseHeadersToAdd(); hs != nil {
		t.Errorf("without the option: %v, want none", hs)
	}
}

// The calls are counted by result, and their takes as the socket's are,
// under the policy label rls:<domain>.
func TestMetrics(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	e.call(request("edge", []string{"tenant", "m"}))
	e.call(request("edge", []string{"tenant", "m"}))
	_, _ = e.callErr(request("", []string{"tenant", "m"}))
	for result, want := range map[string]float64{"ok": 1, "over_limit": 1, "InvalidArgument": 1} {
		if got := e.counter(t, "quotad_rls_calls_total", map[string]string{"result": result}); got != want {
			t.Errorf("quotad_rls_calls_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	for result, want := range map[string]float64{"allowed": 1, "denied": 1} {
		l := map[string]string{"policy": "rls:edge", "algorithm": "calendar", "result": result}
		if got := e.counter(t, "quotad_decisions_total", l); got != want {
			t.Errorf("quotad_decisions_total%v = %v, want %v", l, got, want)
		}
	}
}

// counter is the value of the counter name whose labels include want; -1
// when there is none.
func (e *env) counter(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if l[k] != v {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// The descriptors reload under the running service: a call sees the old
// file or the new one, and a file that fails to load is counted and
// leaves the one in use.
func TestReload(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(edge, "requests_per_unit: 3", "requests_per_unit: 30", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	r := descriptors.NewReloader(path, time.Hour, e.svc, zaptest.NewLogger(t))
	if !r.Load(false) {
		t.Fatal("the changed file was not loaded")
	}
	if resp := e.call(request("edge", []string{"user", "r"})); resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 30 {
		t.Fatalf("after the reload: %v, want the new limit 30", resp)
	}
	if err := os.WriteFile(path, []byte("domain: edge\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r.Load(false) {
		t.Fatal("a bad file was loaded")
	}
	if resp := e.call(request("edge", []string{"user", "r"})); resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 30 {
		t.Fatalf("after a bad file: %v, want the limit in use, 30", resp)
	}
	for result, want := range map[string]float64{"ok": 1, "failed": 1} {
		if got := e.counter(t, "quotad_rls_config_reloads_total", map[string]string{"result": result}); got != want {
			t.Errorf("quotad_rls_config_reloads_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// An invalid trace context in a call's metadata is ignored and counted;
// the call is decided as without one.
func TestInvalidTraceContext(t *testing.T) {
	var ignored atomic.Int64
	e := setup(t, edge, apiPolicy, func(o *rls.ServiceOptions) { o.TraceInvalid = func() { ignored.Add(1) } })
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, md := range [][]string{
		{"traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
		{"traceparent", "garbage"},
		{"traceparent", valid, "traceparent", valid},
		{"traceparent", valid, "tracestate", "not a=state=at all"},
		{"tracestate", "vendor=x"},
	} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), md...)
		if resp, err := e.client.ShouldRateLimit(ctx, request("edge", []string{"free", "tc"})); err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("%v: %v, %v; want OK", md, resp, err)
		}
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", valid, "tracestate", "vendor=x")
	if _, err := e.client.ShouldRateLimit(ctx, request("edge", []string{"free", "tc"})); err != nil {
		t.Fatal(err)
	}
	if n := ignored.Load(); n != 5 {
		t.Errorf("%d calls counted with an ignored trace context, want 5", n)
	}
}
