package tracing

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestStartIsOffWithoutAnEndpoint(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{EnvSampler: "always_on"},
		{EnvEndpoint: "http://collector:4317", EnvSDKDisabled: "true"},
		{EnvEndpoint: "http://collector:4317", EnvTracesExporter: "none"},
	} {
		tp, err := Start(context.Background(), Options{Getenv: envOf(env)})
		if tp != nil || err != nil {
			t.Errorf("Start with %v = %v, %v; want no provider and no error", env, tp, err)
		}
	}
}

func TestStartNamesTheVariableOfAnError(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		name string
	}{
		{map[string]string{EnvEndpoint: "collector:4317"}, EnvEndpoint},
		{map[string]string{EnvTracesEndpoint: "ftp://collector"}, EnvTracesEndpoint},
		{map[string]string{EnvEndpoint: "http://c:4318", EnvProtocol: "http/json"}, EnvProtocol},
		{map[string]string{EnvEndpoint: "http://c:4318", EnvTracesProtocol: "udp"}, EnvTracesProtocol},
		{map[string]string{EnvEndpoint: "http://c:4318", EnvSampler: "sometimes"}, EnvSampler},
		{map[string]string{EnvEndpoint: "http://c:4318", EnvSampler: "traceidratio", EnvSamplerArg: "2"}, EnvSamplerArg},
		{map[string]string{EnvEndpoint: "http://c:4318", EnvTracesExporter: "zipkin"}, EnvTracesExporter},
	} {
		tp, err := Start(context.Background(), Options{Getenv: envOf(tc.env)})
		if err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("Start with %v: %v, want an error naming %s", tc.env, err, tc.name)
		}
		if tp != nil {
			_ = tp.Shutdown(context.Background())
		}
	}
}

func TestStartBuildsTheConfiguredExporter(t *testing.T) {
	for _, tc := range []struct {
		env            map[string]string
		endpoint, prot string
	}{
		{map[string]string{EnvEndpoint: "http://c:4318"}, "http://c:4318/v1/traces", ProtocolHTTP},
		{map[string]string{EnvEndpoint: "http://c:4318/", EnvProtocol: "http/protobuf"}, "http://c:4318/v1/traces", ProtocolHTTP},
		{map[string]string{EnvTracesEndpoint: "https://c/custom", EnvEndpoint: "http://other:1"}, "https://c/custom", ProtocolHTTP},
		{map[string]string{EnvEndpoint: "http://c:4317", EnvProtocol: "grpc"}, "http://c:4317", ProtocolGRPC},
		{map[string]string{EnvEndpoint: "http://c:4317", EnvProtocol: "http/protobuf", EnvTracesProtocol: "grpc"}, "http://c:4317", ProtocolGRPC},
	} {
		tp, err := Start(context.Background(), Options{Getenv: envOf(tc.env)})
		if err != nil || tp == nil {
			t.Fatalf("Start with %v: %v, %v", tc.env, tp, err)
		}
		if tp.Endpoint != tc.endpoint || tp.Protocol != tc.prot {
			t.Errorf("Start with %v: %s over %s, want %s over %s", tc.env, tp.Endpoint, tp.Protocol, tc.endpoint, tc.prot)
		}
		_ = tp.Shutdown(context.Background())
	}
}

func TestSamplers(t *testing.T) {
	parent := func(sampled bool) context.Context {
		flags := trace.TraceFlags(0)
		if sampled {
			flags = trace.FlagsSampled
		}
		return trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: flags, Remote: true}))
	}
	link := func(sampled bool) trace.Link {
		flags := trace.TraceFlags(0)
		if sampled {
			flags = trace.FlagsSampled
		}
		return trace.Link{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{2}, SpanID: trace.SpanID{2}, TraceFlags: flags})}
	}
	sampled := func(env map[string]string, ctx context.Context, links ...trace.Link) bool {
		s, err := samplerOf(envOf(env))
		if err != nil {
			t.Fatal(err)
		}
		r := linkSampler{s}.ShouldSample(sdktrace.SamplingParameters{ParentContext: ctx, TraceID: trace.TraceID{3}, Links: links})
		return r.Decision == sdktrace.RecordAndSample
	}
	none := map[string]string{}
	ratio0 := map[string]string{EnvSampler: "parentbased_traceidratio", EnvSamplerArg: "0"}
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"default, sampled parent", sampled(none, parent(true)), true},
		{"default, parent not sampled", sampled(none, parent(false)), false},
		{"default, no parent", sampled(none, context.Background()), true},
		{"ratio 0, no parent", sampled(ratio0, context.Background()), false},
		{"ratio 0, sampled parent", sampled(ratio0, parent(true)), true},
		{"no parent, a sampled link", sampled(ratio0, context.Background(), link(false), link(true)), true},
		{"no parent, no sampled link", sampled(none, context.Background(), link(false), link(false)), false},
		{"always_off", sampled(map[string]string{EnvSampler: "always_off"}, parent(true)), false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: sampled %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}
