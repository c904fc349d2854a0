// Package otlptest is an OpenTelemetry trace receiver for tests: the
// collector's own protobuf TraceService, served over gRPC, and its OTLP
// HTTP endpoint (POST /v1/traces), on free ports of 127.0.0.1. It keeps
// every span it receives, so that a test can read what a real exporter
// sent.
package otlptest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, with its ids in lower-case hex.
type Span struct {
	Name         string
	TraceID      string
	SpanID       string
	ParentSpanID string // "" for a root
	Kind         tracepb.Span_SpanKind
	Attributes   map[string]any // string, bool, int64, float64 or []any
	Links        []Link
	StatusError  bool
	Resource     map[string]any
	// Via is "grpc" or "http".
	Via string
}

// Link is a span's link to another span.
type Link struct{ TraceID, SpanID string }

// Receiver receives spans over gRPC and HTTP.
type Receiver struct {
	coltrace.UnimplementedTraceServiceServer

	grpcAddr, httpAddr string
	grpcSrv            *grpc.Server
	httpSrv            *http.Server
	done               chan struct{} // closed when both servers have returned

	// countOnly: spans are counted, not kept (Launch).
	countOnly bool
	mu        sync.Mutex
	spans     []Span
	count     int64
	added     chan struct{} // closed and replaced on every export
}

// Start starts a receiver that keeps every span, and stops it at the
// test's end.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r, err := Launch(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// Launch starts a receiver outside a test (make bench); countOnly counts
// the spans it receives (Count) instead of keeping them, for a load that
// sends millions. Close stops it.
func Launch(countOnly bool) (*Receiver, error) {
	r := &Receiver{added: make(chan struct{}), countOnly: countOnly, done: make(chan struct{})}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		gl.Close()
		return nil, err
	}
	r.grpcAddr, r.httpAddr = gl.Addr().String(), hl.Addr().String()
	r.grpcSrv = grpc.NewServer()
	coltrace.RegisterTraceServiceServer(r.grpcSrv, r)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	r.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.grpcSrv.Serve(gl) })
	wg.Go(func() { _ = r.httpSrv.Serve(hl) })
	go func() { wg.Wait(); close(r.done) }()
	return r, nil
}

// Close stops the receiver.
func (r *Receiver) Close() {
	r.grpcSrv.Stop()
	_ = r.httpSrv.Close()
	<-r.done
}

// Count is how many spans the receiver got.
func (r *Receiver) Count() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// GRPCEndpoint is the URL of the gRPC service, for
// OTEL_EXPORTER_OTLP_ENDPOINT with OTEL_EXPORTER_OTLP_PROTOCOL=grpc.
func (r *Receiver) GRPCEndpoint() string { return "http://" + r.grpcAddr }

// HTTPEndpoint is the base URL of the HTTP endpoint, for
// OTEL_EXPORTER_OTLP_ENDPOINT with OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf.
func (r *Receiver) HTTPEndpoint() string { return "http://" + r.httpAddr }

// Export is the TraceService's one method.
func (r *Receiver) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	r.add(req, "grpc")
	return &coltrace.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg, "http")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) add(req *coltrace.ExportTraceServiceRequest, via string) {
	if r.countOnly {
		var n int64
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				n += int64(len(ss.GetSpans()))
			}
		}
		r.mu.Lock()
		r.count += n
		r.mu.Unlock()
		return
	}
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Kind: s.GetKind(),
					Attributes: attrs(s.GetAttributes()), Resource: res, Via: via,
					StatusError: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
				}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.count += int64(len(got))
	close(r.added)
	r.added = make(chan struct{})
	r.mu.Unlock()
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, value(e))
		}
		return out
	}
	return nil
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitFor waits until cond holds for the spans received, up to timeout,
// and returns them; the test fails when it does not.
func (r *Receiver) WaitFor(t testing.TB, what string, timeout time.Duration, cond func([]Span) bool) []Span {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans, added := append([]Span(nil), r.spans...), r.added
		r.mu.Unlock()
		if cond(spans) {
			return spans
		}
		select {
		case <-added:
		case <-deadline.C:
			t.Fatalf("the receiver did not get %s within %v; it got %d spans", what, timeout, len(spans))
			return nil
		}
	}
}
