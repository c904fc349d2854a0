// Package tracing sets up the export of quotad's spans: an OpenTelemetry
// tracer provider that sends them over OTLP (gRPC or HTTP) to a
// collector, configured by the standard OTEL_* environment variables.
//
// It is off unless an OTLP endpoint is set: then Start returns no provider
// and quotad creates no span at all. Export never slows a decision: spans
// go to a bounded queue that a background exporter drains, and a full
// queue drops them. It never decides anything and never reads a request.
package tracing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// The environment variables Start reads, as the OpenTelemetry
// specification names them. The exporters read the others themselves
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE, ...),
// and the batch span processor its OTEL_BSP_* ones.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvSampler        = "OTEL_TRACES_SAMPLER"
	EnvSamplerArg     = "OTEL_TRACES_SAMPLER_ARG"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by the
	// resource (resource.WithFromEnv).
)

// Protocols of OTEL_EXPORTER_OTLP_PROTOCOL that quotad speaks.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// ServiceName is the service.name of quotad's spans unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES says another.
const ServiceName = "quotad"

// Options configures Start.
type Options struct {
	// Getenv reads the environment; nil reads the process's (os.Getenv).
	Getenv func(string) string
	// Version is the service.version of the spans.
	Version string
	// Logger receives the exporter's errors (a collector that is down),
	// at most one line per errorLogEvery.
	Logger *zap.Logger
}

// errorLogEvery bounds the log lines of export errors: a collector that
// is down fails every export, every few seconds, for as long as it is.
const errorLogEvery = time.Minute

// Provider is the tracer provider of a process that exports its spans.
type Provider struct {
	*sdktrace.TracerProvider
	// Endpoint and Protocol say where the spans go, for the start log line.
	Endpoint string
	Protocol string
}

// Start builds the tracer provider the environment configures, or
// returns nil when no OTLP endpoint is set (or OTEL_SDK_DISABLED is true,
// or OTEL_TRACES_EXPORTER is none). Each configuration error names its
// variable. Shutdown the provider to flush its spans.
func Start(ctx context.Context, opts Options) (*Provider, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return nil, nil
	}
	switch e := strings.TrimSpace(getenv(EnvTracesExporter)); e {
	case "", "otlp":
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("%s %q: quotad exports otlp or none", EnvTracesExporter, e)
	}
	endpoint, tracesPath, err := endpointOf(getenv)
	if err != nil || endpoint == "" {
		return nil, err
	}
	proto := cmp.Or(strings.TrimSpace(getenv(EnvTracesProtocol)), strings.TrimSpace(getenv(EnvProtocol)), ProtocolHTTP)
	sampler, err := samplerOf(getenv)
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	switch proto {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	case ProtocolHTTP:
		u := endpoint
		if tracesPath {
			// The base endpoint gets the signal's path, as the
			// specification says; a traces endpoint is used as it is.
			u = strings.TrimSuffix(endpoint, "/") + "/v1/traces"
		}
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u))
		endpoint = u
	default:
		return nil, fmt.Errorf("%s %q: want %s or %s", protocolVar(getenv), proto, ProtocolGRPC, ProtocolHTTP)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp exporter for %s: %w", endpoint, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", ServiceName), attribute.String("service.version", opts.Version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME, over the defaults
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	otel.SetErrorHandler(&errorLog{log: log.Named("tracing")})
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(linkSampler{sampler}),
	)
	return &Provider{TracerProvider: tp, Endpoint: endpoint, Protocol: proto}, nil
}

// endpointOf is the OTLP endpoint of the traces, and whether it is the
// base endpoint, to which HTTP appends /v1/traces.
func endpointOf(getenv func(string) string) (endpoint string, base bool, err error) {
	name := EnvTracesEndpoint
	endpoint = strings.TrimSpace(getenv(name))
	if endpoint == "" {
		name, base = EnvEndpoint, true
		endpoint = strings.TrimSpace(getenv(name))
	}
	if endpoint == "" {
		return "", false, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https" {
		return "", false, fmt.Errorf("%s %q: want a URL such as http://otel-collector:4317", name, endpoint)
	}
	return endpoint, base, nil
}

func protocolVar(getenv func(string) string) string {
	if getenv(EnvTracesProtocol) != "" {
		return EnvTracesProtocol
	}
	return EnvProtocol
}

// samplerOf is the sampler OTEL_TRACES_SAMPLER names, parent-based
// always_on when unset: a decision is sampled when its caller's span is,
// and a decision without a caller's trace context is sampled.
func samplerOf(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.TrimSpace(getenv(EnvSampler))
	arg := strings.TrimSpace(getenv(EnvSamplerArg))
	ratio := func() (sdktrace.Sampler, error) {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1), nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("%s %q: want a ratio from 0 to 1", EnvSamplerArg, arg)
		}
		return sdktrace.TraceIDRatioBased(r), nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		s, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(s), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return ratio()
	}
	return nil, fmt.Errorf("%s %q: want always_on, always_off, traceidratio or parentbased_ with one of them", EnvSampler, name)
}

// linkSampler samples a span without a parent that links to other spans
// (a Redis call that carried several decisions) when any of them is
// sampled, and drops it when none is: such a span belongs to the traces
// it links to, not to a trace of its own. Every other span is base's.
type linkSampler struct{ base sdktrace.Sampler }

func (s linkSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if len(p.Links) == 0 || trace.SpanContextFromContext(p.ParentContext).IsValid() {
		return s.base.ShouldSample(p)
	}
	for _, l := range p.Links {
		if l.SpanContext.IsSampled() {
			return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample}
		}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.Drop}
}

func (s linkSampler) Description() string { return "LinkSampler{" + s.base.Description() + "}" }

// errorLog logs the SDK's errors, one line per errorLogEvery at most.
type errorLog struct {
	log  *zap.Logger
	mu   sync.Mutex
	last time.Time
}

func (e *errorLog) Handle(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if now := time.Now(); now.Sub(e.last) >= errorLogEvery {
		e.last = now
		e.log.Warn("exporting spans failed; spans are dropped while it does", zap.Error(err))
	}
}
