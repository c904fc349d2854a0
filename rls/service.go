package rls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"quotad/dispatch"
	"quotad/limits"
	"quotad/policy"
	"quotad/protocol"
	"quotad/rls/descriptors"
)

// ServiceOptions configures a Service.
type ServiceOptions struct {
	// Dispatcher decides; it is the JSON socket's, so both count the same.
	Dispatcher *dispatch.Dispatcher
	// Config is the descriptors file in use; SetConfig swaps it.
	Config *descriptors.Config
	// ResponseHeaders: see Options.ResponseHeaders.
	ResponseHeaders bool
	// Tracer makes a span of every call; nil for none.
	Tracer trace.TracerProvider
	// TraceInvalid counts a call whose traceparent or tracestate was
	// ignored (sidecar.Server.TraceContextInvalid); nil for none.
	TraceInvalid func()
	// Registry receives the service's metrics; nil for none.
	Registry *prometheus.Registry
	Logger   *zap.Logger
}

// Service is envoy.service.ratelimit.v3.RateLimitService.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	d       *dispatch.Dispatcher
	tab     atomic.Pointer[table]
	headers bool
	tracer  trace.Tracer // nil when tracing is off
	// traceInvalid counts an ignored trace context; nil for none.
	traceInvalid func()
	m            *metrics
	log          *zap.Logger
}

// table is a descriptors file in use, with its domains for the limit
// override, which applies only to a known domain.
type table struct {
	cfg     *descriptors.Config
	domains map[string]bool
}

// NewService returns the service over opts.Dispatcher.
func NewService(opts ServiceOptions) *Service {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	s := &Service{d: opts.Dispatcher, headers: opts.ResponseHeaders, log: opts.Logger.Named("rls"), traceInvalid: opts.TraceInvalid}
	if opts.Tracer != nil {
		s.tracer = opts.Tracer.Tracer(tracerName)
	}
	s.m = newMetrics(opts.Registry)
	s.SetConfig(opts.Config)
	return s
}

// SetConfig swaps the descriptors in use; calls already mapped keep the
// ones they started with.
func (s *Service) SetConfig(c *descriptors.Config) {
	t := &table{cfg: c, domains: map[string]bool{}}
	for _, d := range c.Domains() {
		t.domains[d] = true
	}
	s.tab.Store(t)
}

// Config returns the descriptors in use.
func (s *Service) Config() *descriptors.Config { return s.tab.Load().cfg }

// ShouldRateLimit decides req as one take of its descriptors' checks.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	tr, span := s.startSpan(ctx, req, start)
	resp, err := s.decide(ctx, req, tr)
	s.m.observe(start, resp, err)
	if span != nil {
		endSpan(span, resp, err)
	}
	return resp, err
}

// quotaOf is what a plan needs of a quotad policy.
func (s *Service) quotaOf(name string) (quota int64, shadow, ok bool) {
	p, ok := s.d.Config().Policies[name]
	if !ok {
		return 0, false, false
	}
	return p.Shape().Quota(), p.Mode == policy.ModeShadow, true
}

// run is one decision in flight.
type run struct {
	dec  dispatch.Decision
	done chan struct{}
}

// start prepares and runs req, with the limits given.
func (s *Service) start(req *protocol.Request, given []*dispatch.Given) *run {
	r := &run{done: make(chan struct{})}
	r.dec.Done = func() { close(r.done) }
	if _, decided := s.d.PrepareGiven(req, given, &r.dec); !decided {
		s.d.Run(&r.dec)
	}
	return r
}

// wait waits for r's answer: its outcome, or the call's error when the
// decision failed or the caller went away.
func (r *run) wait(ctx context.Context) (*dispatch.Outcome, error) {
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if o := &r.dec.Out; o.Failed() {
		return nil, failure(o)
	}
	return &r.dec.Out, nil
}

// failure is the gRPC error of a decision that failed: UNAVAILABLE while
// Redis cannot answer (the breaker answers at once) or the sidecar
// drains, so that Envoy's failure_mode_deny decides.
func failure(o *dispatch.Outcome) error {
	msg := string(o.Code) + ": " + o.Message
	switch o.Code {
	case protocol.CodeUnavailable, protocol.CodeShuttingDown:
		return status.Error(codes.Unavailable, msg)
	case protocol.CodeInvalid, protocol.CodeTooLarge:
		return status.Error(codes.InvalidArgument, msg)
	case protocol.CodeUnknownPolicy:
		return status.Error(codes.FailedPrecondition, msg)
	}
	return status.Error(codes.Internal, msg)
}

// outcomeOf is check j of a decision of n checks.
func outcomeOf(o *dispatch.Outcome, j int) dispatch.Outcome {
	if o.Checks == nil {
		return *o
	}
	return o.Checks[j]
}

// request builds the decision of checks idx, with trace context tr.
func (s *Service) request(checks []check, idx []int, tr protocol.Trace) (*protocol.Request, []*dispatch.Given) {
	given := make([]*dispatch.Given, len(idx))
	if len(idx) == 1 {
		c := &checks[idx[0]]
		req := c.req
		req.Trace, req.Headers = tr, s.headers
		given[0] = c.given
		return &req, given
	}
	req := &protocol.Request{Op: protocol.OpTake, Cost: 1, Trace: tr, Headers: s.headers, Checks: make([]protocol.Request, len(idx))}
	policies := false
	for j, i := range idx {
		req.Checks[j] = checks[i].req
		given[j] = checks[i].given
		policies = policies || given[j] == nil
	}
	if policies && s.d.Sharded() {
		// A quotad policy's key is in a slot of its own: on a Redis
		// Cluster the take goes in steps, whose give back on a denial
		// finds what each step took by this id.
		req.RequestID = newRequestID()
		for j := range req.Checks {
			req.Checks[j].RequestID = req.RequestID
		}
	}
	return req, given
}

// newRequestID is a fresh request id: 128 random bits in hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// decide answers req.
func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, tr protocol.Trace) (*rlsv3.RateLimitResponse, error) {
	p, err := planOf(s.tab.Load(), req, s.quotaOf)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	takes := make([]*dispatch.Outcome, len(p.checks))
	peeks := make([]*dispatch.Outcome, len(p.peeks))
	// Peeks (a cost of 0) and give backs (negative hits) deny nothing:
	// each runs beside the take.
	var peekRuns []*run
	for i := range p.peeks {
		peekRuns = append(peekRuns, s.start(s.request(p.peeks, []int{i}, tr)))
	}
	var headers *protocol.HeaderFields
	if p.denied {
		// Over a limit whatever the state: nothing is taken, and the
		// others are peeked at for their statuses.
		var runs []*run
		var idx []int
		for i := range p.checks {
			if p.checks[i].over {
				continue
			}
			c := p.checks[i]
			c.req.Op = protocol.OpPeek
			runs = append(runs, s.start(s.request([]check{c}, []int{0}, tr)))
			idx = append(idx, i)
		}
		for j, r := range runs {
			o, err := r.wait(ctx)
			if err != nil {
				return nil, err
			}
			takes[idx[j]] = o
		}
	} else if headers, err = s.take(ctx, p, takes, tr); err != nil {
		return nil, err
	}
	for i, r := range peekRuns {
		o, err := r.wait(ctx)
		if err != nil {
			return nil, err
		}
		peeks[i] = o
	}
	return s.respond(req, p, takes, peeks, headers), nil
}

// take runs the one take of p's checks (those not over their limit) and
// writes each check's outcome into outs. Quota mode (envoyproxy/
// ratelimit's): a request is over the limit when a descriptor that is not
// in quota mode is, or when every one in quota mode is. So when only
// quota descriptors denied, and not all of them, the take is decided
// again without them: each attempt takes all of its checks or none, so
// no counter ever counts a request that was denied.
func (s *Service) take(ctx context.Context, p *plan, outs []*dispatch.Outcome, tr protocol.Trace) (*protocol.HeaderFields, error) {
	var active []int
	quotaTotal, quotaFailed := 0, 0
	for i := range p.checks {
		c := &p.checks[i]
		if c.quota {
			quotaTotal++
		}
		if c.over {
			if c.quota {
				quotaFailed++
			}
			continue
		}
		active = append(active, i)
	}
	for i := range p.peeks {
		if p.peeks[i].quota {
			quotaTotal++
		}
	}
	for len(active) > 0 {
		r := s.start(s.request(p.checks, active, tr))
		o, err := r.wait(ctx)
		if err != nil {
			return nil, err
		}
		for j, i := range active {
			oc := outcomeOf(o, j)
			outs[i] = &oc
		}
		if o.Allowed {
			return o.HeaderFields(), nil
		}
		var denied []int
		other := false
		for _, i := range active {
			if oc := outs[i]; !oc.Allowed {
				if p.checks[i].quota {
					denied = append(denied, i)
				} else {
					other = true
				}
			}
		}
		if other || len(denied) == 0 || quotaFailed+len(denied) == quotaTotal {
			return o.HeaderFields(), nil
		}
		quotaFailed += len(denied)
		next := active[:0:0]
		for _, i := range active {
			if !outs[i].Allowed && p.checks[i].quota {
				continue
			}
			next = append(next, i)
		}
		active = next
	}
	return nil, nil
}

// respond writes the response: one status per request descriptor, in
// order, and the overall code over them as envoyproxy/ratelimit writes it.
func (s *Service) respond(req *rlsv3.RateLimitRequest, p *plan, takes, peeks []*dispatch.Outcome, headers *protocol.HeaderFields) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(p.items))}
	now := time.Now()
	over, quotaTotal, quotaOver := false, 0, 0
	var passed []*descriptors.RateLimit
	for i := range p.items {
		it := &p.items[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case it.limit == nil:
			continue
		case it.unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		var c *check
		var o *dispatch.Outcome
		switch {
		case it.peek:
			c, o = &p.peeks[it.check], peeks[it.check]
		case it.check >= 0:
			c, o = &p.checks[it.check], takes[it.check]
		}
		st.CurrentLimit = currentLimit(it.limit, o)
		quota := it.limit.QuotaMode
		if quota {
			quotaTotal++
		}
		denied := false
		switch {
		case it.empty:
			st.DurationUntilReset = untilReset(it.limit, now)
		case c.over:
			denied = true
			if c.given != nil {
				st.DurationUntilReset = untilReset(it.limit, now)
			}
		case o != nil:
			denied = o.Denied()
			if !denied && !o.Skipped {
				st.LimitRemaining = uint32(min(max(o.Remaining, 0), math.MaxUint32))
			}
			st.DurationUntilReset = durationpb.New(time.Duration(max(o.ResetMS, 0)) * time.Millisecond)
		}
		shadow := c != nil && c.shadow
		if o != nil && o.Shadow {
			shadow = true
		}
		switch {
		case !denied:
			passed = append(passed, it.limit)
		case shadow:
			// Shadow mode: over the limit, answered OK.
		default:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			if quota {
				quotaOver++
			} else {
				over = true
			}
		}
	}
	if over || quotaTotal > 0 && quotaOver == quotaTotal {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	} else {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
	}
	resp.DynamicMetadata = metadataOf(req, passed)
	if headers != nil {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "RateLimit-Policy", Value: headers.Policy})
		if headers.RateLimit != "" {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "RateLimit", Value: headers.RateLimit})
		}
		if headers.RetryAfter != "" && resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "Retry-After", Value: headers.RetryAfter})
		}
	}
	return resp
}

// currentLimit is a status's current_limit: the file's (or the
// override's) limit, or for a quotad policy its limit and, when its
// window is one unit, that unit.
func currentLimit(l *descriptors.RateLimit, o *dispatch.Outcome) *rlsv3.RateLimitResponse_RateLimit {
	cl := &rlsv3.RateLimitResponse_RateLimit{Name: l.Name}
	if l.Policy == "" {
		cl.RequestsPerUnit, cl.Unit = l.RequestsPerUnit, rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit)
		if l.UnitMultiplier > 1 {
			cl.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
		}
		return cl
	}
	if o == nil {
		return cl
	}
	cl.RequestsPerUnit = uint32(min(o.Limit, math.MaxUint32))
	cl.Unit = unitOf(o.Shape)
	return cl
}

// unitOf is the unit of a policy's window when it is exactly one.
func unitOf(s limits.Shape) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch w := s.(type) {
	case limits.Window:
		switch w.WindowMS {
		case 1000:
			return rlsv3.RateLimitResponse_RateLimit_SECOND
		case 60_000:
			return rlsv3.RateLimitResponse_RateLimit_MINUTE
		case 3_600_000:
			return rlsv3.RateLimitResponse_RateLimit_HOUR
		case 86_400_000:
			return rlsv3.RateLimitResponse_RateLimit_DAY
		}
	case limits.CalendarWindow:
		switch w.Period {
		case limits.PeriodMinute:
			return rlsv3.RateLimitResponse_RateLimit_MINUTE
		case limits.PeriodHour:
			return rlsv3.RateLimitResponse_RateLimit_HOUR
		case limits.PeriodDay:
			return rlsv3.RateLimitResponse_RateLimit_DAY
		case limits.PeriodWeek:
			return rlsv3.RateLimitResponse_RateLimit_WEEK
		case limits.PeriodMonth:
			return rlsv3.RateLimitResponse_RateLimit_MONTH
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// untilReset is the time to the end of l's window holding now, for a
// status decided without Redis.
func untilReset(l *descriptors.RateLimit, now time.Time) *durationpb.Duration {
	w := limits.EpochWindow(1, l.Unit.Seconds()*max(int64(l.UnitMultiplier), 1))
	_, end := w.Bounds(now)
	return durationpb.New(end.Sub(now).Round(time.Millisecond))
}
