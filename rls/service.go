package rls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"sync"
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
// override, which applies only to a known domain, and what its calls'
// answers share, made once: the names and hash tags of its domains, and
// the current_limit of each of its limits.
type table struct {
	cfg     *descriptors.Config
	domains map[string]*domainOf
	// current is the current_limit of each limit of cfg that is not a
	// quotad policy's, made at its first use: a *descriptors.RateLimit
	// to its *rlsv3.RateLimitResponse_RateLimit, shared by every
	// response, which only reads it.
	current sync.Map
}

// domainOf is what the counters of a domain share: the policy label
// ("rls:<domain>") and the hash tag ("{<domain>}").
type domainOf struct {
	name, tag string
}

func newDomain(d string) *domainOf {
	return &domainOf{name: "rls:" + d, tag: "{" + d + "}"}
}

// domain is d's, known or not.
func (t *table) domain(d string) (dom *domainOf, known bool) {
	if dom, ok := t.domains[d]; ok {
		return dom, true
	}
	return newDomain(d), false
}

// currentLimit is l's current_limit when l is the file's: made once per
// table.
func (t *table) currentLimit(l *descriptors.RateLimit) *rlsv3.RateLimitResponse_RateLimit {
	if cl, ok := t.current.Load(l); ok {
		return cl.(*rlsv3.RateLimitResponse_RateLimit)
	}
	cl, _ := t.current.LoadOrStore(l, currentLimit(l, nil))
	return cl.(*rlsv3.RateLimitResponse_RateLimit)
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
	t := &table{cfg: c, domains: map[string]*domainOf{}}
	for _, d := range c.Domains() {
		t.domains[d] = newDomain(d)
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

// run is one decision of a call, with the room of its request. Runs are
// reused: a call's runs go back to the pool with its plan once every one
// of them ended (ended), when the call is answered.
type run struct {
	dec dispatch.Decision
	// done gets a token when the decision ends; ended is set once it was
	// received.
	done  chan struct{}
	ended bool
	req   protocol.Request
	// The room of a take of a few checks: its checks' requests and
	// given limits.
	checkRoom [smallPlan]protocol.Request
	givenRoom [smallPlan]*dispatch.Given
}

var runPool = sync.Pool{New: func() any {
	r := &run{done: make(chan struct{}, 1)}
	r.dec.Done = func() { r.done <- struct{}{} }
	return r
}}

// start prepares and runs the decision of checks idx, with trace context
// tr, as one of p's runs.
func (s *Service) start(p *plan, checks []check, idx []int, tr protocol.Trace) *run {
	r := runPool.Get().(*run)
	r.ended = false
	p.runs = append(p.runs, r)
	given := s.request(r, checks, idx, tr)
	if _, decided := s.d.PrepareGiven(&r.req, given, &r.dec); !decided {
		s.d.Run(&r.dec)
	}
	return r
}

// wait waits for r's answer: its outcome, or the call's error when the
// decision failed or the caller went away.
func (r *run) wait(ctx context.Context) (*dispatch.Outcome, error) {
	select {
	case <-r.done:
		r.ended = true
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if o := &r.dec.Out; o.Failed() {
		return nil, failure(o)
	}
	return &r.dec.Out, nil
}

// free puts p and its runs back for later calls, when every run ended: a
// run still in flight holds its request and p's given limits, and is
// left to the garbage collector with p.
func free(p *plan) {
	for _, r := range p.runs {
		if !r.ended {
			return
		}
	}
	for i, r := range p.runs {
		clear(r.checkRoom[:])
		clear(r.givenRoom[:])
		r.req = protocol.Request{}
		runPool.Put(r)
		p.runs[i] = nil
	}
	freePlan(p)
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

// outcomeOf is check j of a decision of n checks, which no one writes
// once decided.
func outcomeOf(o *dispatch.Outcome, j int) *dispatch.Outcome {
	if o.Checks == nil {
		return o
	}
	return &o.Checks[j]
}

// request writes the decision of checks idx, with trace context tr, into
// r.req, and returns its given limits.
func (s *Service) request(r *run, checks []check, idx []int, tr protocol.Trace) []*dispatch.Given {
	var given []*dispatch.Given
	if len(idx) <= len(r.givenRoom) {
		given = r.givenRoom[:len(idx)]
	} else {
		given = make([]*dispatch.Given, len(idx))
	}
	if len(idx) == 1 {
		c := &checks[idx[0]]
		r.req = c.req
		r.req.Trace, r.req.Headers = tr, s.headers
		given[0] = c.given
		return given
	}
	r.req = protocol.Request{Op: protocol.OpTake, Cost: 1, Trace: tr, Headers: s.headers}
	req := &r.req
	if len(idx) <= len(r.checkRoom) {
		req.Checks = r.checkRoom[:len(idx)]
	} else {
		req.Checks = make([]protocol.Request, len(idx))
	}
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
	return given
}

// newRequestID is a fresh request id: 128 random bits in hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// decide answers req.
func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, tr protocol.Trace) (*rlsv3.RateLimitResponse, error) {
	tab := s.tab.Load()
	p, err := planOf(tab, req, s.quotaOf)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	defer free(p)
	takes := make([]*dispatch.Outcome, len(p.checks))
	peeks := make([]*dispatch.Outcome, len(p.peeks))
	// Peeks (a cost of 0) and give backs (negative hits) deny nothing:
	// each runs beside the take.
	var peekRuns []*run
	for i := range p.peeks {
		peekRuns = append(peekRuns, s.start(p, p.peeks, []int{i}, tr))
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
			runs = append(runs, s.start(p, []check{c}, []int{0}, tr))
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
	return s.respond(tab, req, p, takes, peeks, headers), nil
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
		var o *dispatch.Outcome
		var err error
		if plain, pol, ok := s.split(p.checks, active); ok {
			o, err = s.policyLast(ctx, p, plain, pol, outs, tr)
		} else {
			o, err = s.takeOnce(ctx, p, p.checks, active, outs, tr)
		}
		if err != nil {
			return nil, err
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

// takeOnce takes checks idx as one decision, writing each one's outcome
// into outs.
func (s *Service) takeOnce(ctx context.Context, p *plan, checks []check, idx []int, outs []*dispatch.Outcome, tr protocol.Trace) (*dispatch.Outcome, error) {
	o, err := s.start(p, checks, idx, tr).wait(ctx)
	if err != nil {
		return nil, err
	}
	for j, i := range idx {
		outs[i] = outcomeOf(o, j)
	}
	return o, nil
}

// split finds a take the service makes in two steps itself: on a Redis
// Cluster, the file's counters (all in their domain's slot) and one
// quotad policy's counter, in a slot of its own. ok false: the take is
// one decision (in steps under a request id when it has counters of
// several quotad policies).
func (s *Service) split(checks []check, active []int) (plain []int, pol int, ok bool) {
	if !s.d.Sharded() {
		return nil, -1, false
	}
	pol = -1
	for _, i := range active {
		switch {
		case checks[i].given != nil:
			plain = append(plain, i)
		case pol >= 0:
			return nil, -1, false
		default:
			pol = i
		}
	}
	return plain, pol, pol >= 0 && len(plain) > 0
}

// policyLast takes the file's counters plain first, as one script in
// their domain's slot, then, when they pass, the quotad policy's counter
// pol. When the policy denies, each of the first step's counters gets its
// cost back, in the window it was counted in: so a denied call consumes
// nothing, and no request id (no record per call in the windows) is
// needed. Between the steps the first holds its cost, which may deny
// others meanwhile, never admit them. The outcome is the two steps' as
// one take's.
func (s *Service) policyLast(ctx context.Context, p *plan, plain []int, pol int, outs []*dispatch.Outcome, tr protocol.Trace) (*dispatch.Outcome, error) {
	checks := p.checks
	// The steps are waited for even when the caller goes away, so that
	// the call takes from both counters or from neither.
	ctx = context.WithoutCancel(ctx)
	sent := time.Now()
	o1, err := s.takeOnce(ctx, p, checks, plain, outs, tr)
	if err != nil {
		return nil, err
	}
	took := time.Since(sent)
	if o1.Allowed {
		if _, err := s.takeOnce(ctx, p, checks, []int{pol}, outs, tr); err != nil {
			s.giveBack(p, plain, outs, sent, took, tr)
			return nil, err
		}
		if !outs[pol].Allowed {
			s.giveBack(p, plain, outs, sent, took, tr)
		}
	} else {
		// Not asked, as a later step of a take in steps is not.
		c := &checks[pol]
		oc := dispatch.Outcome{Op: protocol.OpTake, Policy: c.req.Policy, Headers: s.headers, Allowed: true, Skipped: true}
		if p, ok := s.d.Config().Policies[c.req.Policy]; ok {
			oc.Limit, oc.Shape, oc.Remaining = p.Shape().Quota(), p.Shape(), p.Shape().Quota()
		}
		outs[pol] = &oc
	}
	o := &dispatch.Outcome{Op: protocol.OpTake, Headers: s.headers, Allowed: true, Checks: make([]dispatch.Outcome, 0, len(plain)+1)}
	for _, i := range append(plain[:len(plain):len(plain)], pol) {
		oc := outs[i]
		o.Checks = append(o.Checks, *oc)
		o.Allowed = o.Allowed && oc.Allowed
		o.Degraded = o.Degraded || oc.Degraded
		if !oc.Allowed {
			o.RetryAfterMS = max(o.RetryAfterMS, oc.RetryAfterMS)
		}
	}
	return o, nil
}

// giveBack gives the cost of checks idx, taken by a call sent at sent
// that took took, back to the windows they were counted in (each its own
// decision, at once), and waits for them. A window is known from its
// take's reset_ms and the sidecar's clock, to the nearest window end
// (windowStart); when that is not sure, or Redis's clock has left the
// window, nothing is given back, and the cost is held until the window
// ends: a give back never reaches a window the take did not count in.
func (s *Service) giveBack(p *plan, idx []int, outs []*dispatch.Outcome, sent time.Time, took time.Duration, tr protocol.Trace) {
	checks := p.checks
	var runs []*run
	for _, i := range idx {
		c, o := checks[i], outs[i]
		if !o.Allowed || o.Skipped || o.Replay {
			continue
		}
		start, ok := windowStart(c.limit, sent, took, o.ResetMS)
		if !ok {
			s.log.Warn("could not give back a counter of a denied call: it holds its cost until its window ends",
				zap.String("counter", c.given.Counter), zap.Duration("took", took),
				zap.String("why", "its window is not sure: the take took, or the sidecar's clock is off redis's by, more than an eighth of a window"))
			continue
		}
		g := *c.given
		g.GiveBack, g.Period = true, start
		c.given, c.req.Op = &g, protocol.OpPeek
		runs = append(runs, s.start(p, []check{c}, []int{0}, tr))
	}
	for _, r := range runs {
		<-r.done
		r.ended = true
		if o := &r.dec.Out; o.Failed() {
			s.log.Warn("could not give back a counter of a denied call: it holds its cost until its window ends",
				zap.String("code", string(o.Code)), zap.String("message", o.Message))
		}
	}
}

// windowStart is the start (Unix ms) of the epoch window of l that a take
// sent at sent, answered after took, counted in, its end resetMS after
// the script ran: sent+resetMS to the nearest window end. The script ran
// within took of sent, so that end is late by at most took plus the
// clocks' difference. ok false, so that no window is guessed, when took
// is more than an eighth of a window or sent+resetMS more than an eighth
// from a window end: a wrong window needs clocks three quarters of a
// window apart.
func windowStart(l *descriptors.RateLimit, sent time.Time, took time.Duration, resetMS int64) (int64, bool) {
	size := l.Unit.Seconds() * max(int64(l.UnitMultiplier), 1) * 1000
	if took.Milliseconds() > size/8 {
		return 0, false
	}
	end := sent.UnixMilli() + resetMS
	nearest := (end + size/2) / size * size
	if d := end - nearest; d > size/8 || d < -size/8 {
		return 0, false
	}
	return nearest - size, true
}

// respond writes the response: one status per request descriptor, in
// order, and the overall code over them as envoyproxy/ratelimit writes it.
func (s *Service) respond(tab *table, req *rlsv3.RateLimitRequest, p *plan, takes, peeks []*dispatch.Outcome, headers *protocol.HeaderFields) *rlsv3.RateLimitResponse {
	// The statuses, and their durations, are allocated together.
	n := len(p.items)
	resp := &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	sts, durs := make([]rlsv3.RateLimitResponse_DescriptorStatus, n), make([]durationpb.Duration, n)
	now := time.Now()
	over, quotaTotal, quotaOver := false, 0, 0
	var room [smallPlan]*descriptors.RateLimit
	passed := room[:0]
	for i := range p.items {
		it := &p.items[i]
		st := &sts[i]
		st.Code = rlsv3.RateLimitResponse_OK
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
		if it.limit.Policy != "" || it.override {
			st.CurrentLimit = currentLimit(it.limit, o)
		} else {
			st.CurrentLimit = tab.currentLimit(it.limit)
		}
		quota := it.limit.QuotaMode
		if quota {
			quotaTotal++
		}
		denied := false
		switch {
		case it.empty:
			st.DurationUntilReset = setDuration(&durs[i], untilReset(it.limit, now))
		case c.over:
			denied = true
			if c.given != nil {
				st.DurationUntilReset = setDuration(&durs[i], untilReset(it.limit, now))
			}
		case o != nil:
			denied = o.Denied()
			if !denied && !o.Skipped {
				st.LimitRemaining = uint32(min(max(o.Remaining, 0), math.MaxUint32))
			}
			st.DurationUntilReset = setDuration(&durs[i], time.Duration(max(o.ResetMS, 0))*time.Millisecond)
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
func untilReset(l *descriptors.RateLimit, now time.Time) time.Duration {
	w := limits.EpochWindow(1, l.Unit.Seconds()*max(int64(l.UnitMultiplier), 1))
	_, end := w.Bounds(now)
	return end.Sub(now).Round(time.Millisecond)
}

// setDuration sets du to d, as durationpb.New would make it, and returns
// it.
func setDuration(du *durationpb.Duration, d time.Duration) *durationpb.Duration {
	du.Seconds, du.Nanos = int64(d/time.Second), int32(d%time.Second)
	return du
}
