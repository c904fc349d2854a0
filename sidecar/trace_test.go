package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/dispatch"
	"quotad/integration/otlptest"
	"quotad/integration/redistest"
	"quotad/tracing"
)

const testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestTraceContextChangesNoReply: a request with a trace context, valid or
// not, gets the reply it gets without one, byte for byte; the invalid
// ones are counted.
func TestTraceContextChangesNoReply(t *testing.T) {
	r := redistest.Start(t)
	ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	traces := []struct {
		fields  string
		invalid bool
	}{
		{``, false},
		{`,"traceparent":"` + testTraceParent + `"`, false},
		{`,"traceparent":"` + testTraceParent + `","tracestate":"a=b"`, false},
		{`,"traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"`, true},
		{`,"traceparent":42`, true},
		{`,"traceparent":"` + testTraceParent + `","tracestate":"A=b"`, true},
		{`,"traceparent":"nonsense","traceparent":"nonsense"`, true},
	}
	invalid := 0.0
	for i, tr := range traces {
		for _, line := range []struct{ plain, traced string }{
			{`{"op":"peek","id":1,"subject":"never-taken","limit":3,"window_ms":60000}`, ""},
			{`{"op":"take","id":2,"subject":"s","policy":"nope"}`, ""},
			{`{"op":"take","id":3,"subject":"s","limit":0,"window_ms":60000}`, ""},
			{`{"op":"ping","id":4}`, ""},
		} {
			traced := line.plain[:len(line.plain)-1] + tr.fields + `}`
			want := c.callRaw(line.plain)
			if got := c.callRaw(traced); got != want {
				t.Errorf("%s\n got  %s\n want %s (as without the trace context)", traced, got, want)
			}
			if tr.invalid {
				invalid++
			}
		}
		// A take decides as without: the first of a limit of 1 is allowed,
		// the second denied.
		take := inlineTake("t", "take-"+strconv.Itoa(i), 1, tr.fields)
		if rep := c.call(take); !rep.OK || !rep.Allowed {
			t.Errorf("%s: %+v, want allowed", take, rep)
		}
		if rep := c.call(take); !rep.OK || rep.Allowed {
			t.Errorf("%s again: %+v, want denied", take, rep)
		}
		if tr.invalid {
			invalid += 2
		}
	}
	if got := metricValue(t, ts.Server, "quotad_trace_context_invalid_total", nil); got != invalid {
		t.Errorf("quotad_trace_context_invalid_total = %v, want %v", got, invalid)
	}
}

// startTracing is the tracer provider serve builds, exporting to endpoint
// over proto, flushed by the caller.
func startTracing(t *testing.T, proto, endpoint string) *tracing.Provider {
	t.Helper()
	env := map[string]string{tracing.EnvEndpoint: endpoint, tracing.EnvProtocol: proto}
	tp, err := tracing.Start(context.Background(), tracing.Options{Version: "test", Getenv: func(k string) string { return env[k] }})
	if err != nil || tp == nil {
		t.Fatalf("tracing.Start: %v, %v", tp, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = tp.Shutdown(ctx)
	})
	return tp
}

// flush exports the spans ended so far.
func flush(t *testing.T, tp *tracing.Provider) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := tp.ForceFlush(ctx); err != nil {
		t.Fatalf("ForceFlush: %v", err)
	}
}

func findSpan(spans []otlptest.Span, match func(otlptest.Span) bool) (otlptest.Span, bool) {
	for _, s := range spans {
		if match(s) {
			return s, true
		}
	}
	return otlptest.Span{}, false
}

// A take sent with a traceparent shows up in the collector, with its
// Redis call, under that trace: its span is a child of the caller's, its
// Redis call a child of it. Its decision log line and the exemplar of its
// latency name the trace.
func TestTraceSpansReachTheReceiver(t *testing.T) {
	for _, proto := range []string{tracing.ProtocolGRPC, tracing.ProtocolHTTP} {
		t.Run(proto, func(t *testing.T) {
			recv := otlptest.Start(t)
			endpoint, via := recv.GRPCEndpoint(), "grpc"
			if proto == tracing.ProtocolHTTP {
				endpoint, via = recv.HTTPEndpoint(), "http"
			}
			tp := startTracing(t, proto, endpoint)
			r := redistest.Start(t)
			core, logs := observer.New(zapcore.InfoLevel)
			ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true, Tracer: tp,
				Logger: zap.New(core), LogDecisions: dispatch.LogDecisionsAll})
			c := ts.dial(t)
			waitRedisOK(t, c)
			const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
			rep := c.call(inlineTake("1", "traced", 5, `,"traceparent":"00-`+traceID+`-`+parentID+`-01","tracestate":"vendor=x"`))
			if !rep.OK || !rep.Allowed {
				t.Fatalf("traced take: %+v", rep)
			}
			flush(t, tp)
			isTake := func(s otlptest.Span) bool { return s.Name == "take" && s.TraceID == traceID }
			spans := recv.WaitFor(t, "the take's span and its Redis call", waitTimeout, func(spans []otlptest.Span) bool {
				take, ok := findSpan(spans, isTake)
				if !ok {
					return false
				}
				_, ok = findSpan(spans, func(s otlptest.Span) bool { return s.ParentSpanID == take.SpanID })
				return ok
			})
			take, _ := findSpan(spans, isTake)
			if take.ParentSpanID != parentID || take.Via != via || take.Kind != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("take span: parent %s via %s kind %v, want parent %s via %s, a server span", take.ParentSpanID, take.Via, take.Kind, parentID, via)
			}
			for k, want := range map[string]any{"quotad.op": "take", "quotad.verdict": "allowed", "quotad.algorithm": "fixed_window",
				"quotad.policy": "", "quotad.replay": false, "quotad.local": false, "quotad.allotted": false, "quotad.degraded": false} {
				if got := take.Attributes[k]; got != want {
					t.Errorf("take span attribute %s = %#v, want %#v", k, got, want)
				}
			}
			if got := take.Resource["service.name"]; got != "quotad" {
				t.Errorf("service.name = %v, want quotad", got)
			}
			call, _ := findSpan(spans, func(s otlptest.Span) bool { return s.ParentSpanID == take.SpanID })
			if call.TraceID != traceID || call.Name != "EVALSHA" || call.Attributes["db.system.name"] != "redis" ||
				call.Attributes["quotad.call.decisions"] != int64(1) || call.Kind != tracepb.Span_SPAN_KIND_CLIENT {
				t.Errorf("the take's Redis call: %+v", call)
			}

			lines := logs.FilterMessage("decision").All()
			if len(lines) != 1 {
				t.Fatalf("%d decision log lines, want 1", len(lines))
			}
			if f := lines[0].ContextMap(); f["trace_id"] != traceID || f["span_id"] != take.SpanID {
				t.Errorf("decision log line: trace_id %v span_id %v, want %s %s", f["trace_id"], f["span_id"], traceID, take.SpanID)
			}
			checkExemplar(t, ts.Server, traceID)
		})
	}
}

// checkExemplar checks that the latency histogram carries an exemplar of
// traceID: in the OpenMetrics text exposition (the one that has
// exemplars), and in the protobuf one, which expfmt decodes; and that the
// classic text exposition, without exemplars, still parses.
func checkExemplar(t *testing.T, s *Server, traceID string) {
	t.Helper()
	h := s.HTTPHandler()
	scrape := func(accept string) (string, string) {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Accept", accept)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result().Header.Get("Content-Type"), rec.Body.String()
	}

	ct, body := scrape("application/openmetrics-text;version=1.0.0")
	if !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("Content-Type %q, want OpenMetrics", ct)
	}
	exemplar := regexp.MustCompile(`(?m)^quotad_request_duration_seconds_bucket\{op="take",le="[^"]+"\} [0-9]+ # \{trace_id="` + traceID + `"\} [0-9.e-]+ [0-9.e+]+$`)
	if !exemplar.MatchString(body) {
		t.Errorf("no OpenMetrics exemplar of trace %s on the take latency:\n%s", traceID, grepLines(body, "quotad_request_duration_seconds_bucket"))
	}

	ct, body = scrape(string(expfmt.NewFormat(expfmt.TypeProtoDelim)))
	dec := expfmt.NewDecoder(strings.NewReader(body), expfmt.Format(ct))
	found := false
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("decode the protobuf exposition: %v", err)
			}
			break
		}
		if mf.GetName() != "quotad_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				for _, lp := range b.GetExemplar().GetLabel() {
					found = found || lp.GetName() == "trace_id" && lp.GetValue() == traceID
				}
			}
		}
	}
	if !found {
		t.Errorf("the protobuf exposition has no exemplar of trace %s", traceID)
	}

	_, body = scrape("text/plain")
	p := expfmt.NewTextParser(model.LegacyValidation)
	if _, err := p.TextToMetricFamilies(strings.NewReader(body)); err != nil {
		t.Errorf("the text exposition does not parse: %v", err)
	}
}

func grepLines(body, sub string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A batch carries the decisions of many traces: its span links to every
// one of them, and each links back to it; none is made its parent.
func TestTraceBatchLinksEveryDecision(t *testing.T) {
	recv := otlptest.Start(t)
	tp := startTracing(t, tracing.ProtocolGRPC, recv.GRPCEndpoint())
	r := redistest.Start(t)
	ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true, Tracer: tp})
	c := ts.dial(t)
	waitRedisOK(t, c)
	flush(t, tp)
	const n = 32
	lines := make([]string, n)
	traceIDs := map[string]bool{}
	for i := range lines {
		id := fmt.Sprintf("%032x", 0xabc000+i)
		traceIDs[id] = true
		lines[i] = inlineTake(strconv.Itoa(i), "s"+strconv.Itoa(i), 10, `,"traceparent":"00-`+id+`-00f067aa0ba902b7-01"`)
	}
	pauseWrites(t, r)
	c.send(lines...)
	waitFor(t, "every take to be read", func() bool { return ts.running() == n })
	unpause(t, r)
	for i := range n {
		if got := c.recv(); !got.OK || !got.Allowed {
			t.Fatalf("take %d: %+v", i, got)
		}
	}
	flush(t, tp)
	spans := recv.WaitFor(t, "every take's span", waitTimeout, func(spans []otlptest.Span) bool {
		got := 0
		for _, s := range spans {
			if s.Name == "take" && traceIDs[s.TraceID] {
				got++
			}
		}
		return got == n
	})
	decisions := map[string]otlptest.Span{} // by span id
	for _, s := range spans {
		if s.Name == "take" && traceIDs[s.TraceID] {
			decisions[s.SpanID] = s
		}
	}
	carried := map[string]int{} // decision span id: the calls that carried it
	batches := 0
	for _, s := range spans {
		if s.Name != "EVALSHA" {
			continue
		}
		if d, ok := decisions[s.ParentSpanID]; ok {
			if s.TraceID != d.TraceID || len(s.Links) != 0 || s.Attributes["quotad.call.decisions"] != int64(1) {
				t.Errorf("a call of one decision: %+v", s)
			}
			carried[d.SpanID]++
			continue
		}
		batches++
		if s.ParentSpanID != "" || traceIDs[s.TraceID] {
			t.Errorf("a batch's span has parent %q in trace %s: it must be a root of its own", s.ParentSpanID, s.TraceID)
		}
		if got := s.Attributes["quotad.call.decisions"]; got != int64(len(s.Links)) {
			t.Errorf("a batch of %v decisions has %d links", got, len(s.Links))
		}
		for _, l := range s.Links {
			d, ok := decisions[l.SpanID]
			if !ok || d.TraceID != l.TraceID {
				t.Errorf("a batch links to %+v, no take of the test", l)
				continue
			}
			carried[d.SpanID]++
			if len(d.Links) != 1 || d.Links[0] != (otlptest.Link{TraceID: s.TraceID, SpanID: s.SpanID}) {
				t.Errorf("take span %s links to %+v, want its batch %s", d.SpanID, d.Links, s.SpanID)
			}
		}
	}
	if batches == 0 {
		t.Fatal("no batch of several decisions: the paused Redis should have gathered some")
	}
	for id, d := range decisions {
		if carried[id] != 1 {
			t.Errorf("take span %s (trace %s) was carried by %d calls, want 1", id, d.TraceID, carried[id])
		}
	}
}

// An exporter whose collector is down never fails a decision: every take
// is answered as without tracing.
func TestTraceExporterDownNeverFailsADecision(t *testing.T) {
	for _, proto := range []string{tracing.ProtocolGRPC, tracing.ProtocolHTTP} {
		t.Run(proto, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			down := "http://" + l.Addr().String()
			l.Close() // nothing listens there any more
			// Each export gives up soon, so that the exporter has stopped
			// by the end of the test.
			t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "200")
			tp := startTracing(t, proto, down)
			r := redistest.Start(t)
			ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true, Tracer: tp})
			c := ts.dial(t)
			waitRedisOK(t, c)
			const limit, takes = 40, 60
			for i := range takes {
				rep := c.call(inlineTake(strconv.Itoa(i), "down", limit, `,"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"`))
				if !rep.OK || rep.Allowed != (i < limit) || rep.Used != int64(min(i+1, limit)) {
					t.Fatalf("take %d with the collector down: %+v", i, rep)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_ = tp.ForceFlush(ctx) // fails: nobody listens
			if rep := c.call(inlineTake("after", "down", limit, "")); !rep.OK || rep.Allowed {
				t.Fatalf("take after a failed export: %+v", rep)
			}
		})
	}
}
