package dispatch

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"quotad/limits"
	"quotad/luascript"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

// Options configures a Dispatcher. Zero values take the defaults.
type Options struct {
	Store     *store.Store
	Config    *policy.Config
	KeyPrefix string
	// RedisTimeout is the deadline of every Redis call; a request's
	// timeout_ms may shorten it, never lengthen it.
	RedisTimeout time.Duration
	AllowInline  bool
	Logger       *zap.Logger
	// LogDecisions is none (or empty), denied or all: which takes get a
	// line in the sampled decision log.
	LogDecisions string
	// Registry receives the decision metrics; nil for none.
	Registry *prometheus.Registry
	// Context is the parent of every Redis call: cancelling it ends the
	// calls in flight at once.
	Context context.Context
	// Draining reports whether the sidecar is shutting down, so that a
	// call its cancellation ended answers SHUTTING_DOWN.
	Draining func() bool
	// Tracer makes a span of every decision and script call (trace.go);
	// nil for none.
	Tracer trace.TracerProvider
}

// Dispatcher decides requests: it resolves a request's limits (a named
// policy or inline ones), hands the decision to the request's algorithm,
// and sends the algorithm's script call to Redis in a shared batch.
type Dispatcher struct {
	opts    Options
	log     *zap.Logger
	store   *store.Store
	cfg     atomic.Pointer[policy.Config]
	deny    *localDeny
	batch   batcher
	metrics *metrics
	healed  atomic.Int64
	tracer  trace.Tracer // nil when tracing is off
	// slotOwner is store.SlotOwner, made once: a method value made per
	// call is an allocation per call.
	slotOwner func(slot uint16) string
	// scripts puts the scripts into Redis before the calls need them.
	scripts *luascript.Loader
	allot   *allotments // allotment.go
}

// New returns a dispatcher; Close stops it.
func New(opts Options) *Dispatcher {
	if opts.RedisTimeout <= 0 {
		opts.RedisTimeout = store.DefaultRedisTimeout
	}
	if opts.Config == nil {
		opts.Config = &policy.Config{Policies: map[string]*policy.Policy{}}
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Context == nil {
		opts.Context = context.Background()
	}
	if opts.Draining == nil {
		opts.Draining = func() bool { return false }
	}
	d := &Dispatcher{
		opts:  opts,
		log:   opts.Logger.Named("dispatch"),
		store: opts.Store,
		deny:  newLocalDeny(DefaultLocalDenyEntries),
	}
	d.cfg.Store(opts.Config)
	d.slotOwner = d.store.SlotOwner
	if opts.Tracer != nil {
		d.tracer = opts.Tracer.Tracer(tracerName)
	}
	d.metrics = newMetrics(d, opts)
	d.allot = newAllotments(d, opts.Registry)
	d.scripts = luascript.NewLoader(luascript.LoaderOptions{Report: d.loaded})
	if d.store != nil && d.store.Kind() == store.StoreRedis {
		// The embedded store is in this process: a script it lacks costs
		// no link, and is loaded when a call finds it missing.
		d.store.OnConnect(d.scripts.Connected)
	}
	d.batch.start(d)
	return d
}

// Close stops the batcher once the decisions submitted are answered, and
// the script loads.
func (d *Dispatcher) Close() {
	d.allot.close()
	d.batch.close()
	if d.store != nil {
		d.store.OnConnect(nil)
	}
	d.scripts.Close()
}

// client is the store's client as the decisions send through it: timed
// (metrics.go), and with the scripts loaded into Redis when a node answers
// NOSCRIPT (luascript.Loader).
func (d *Dispatcher) client(c rueidis.Client) rueidis.Client {
	return d.scripts.Client(d.metrics.instrument(c), d.slotOwner)
}

// loaded logs and counts what a check or load of a node's scripts did.
func (d *Dispatcher) loaded(r luascript.LoadReport) {
	d.metrics.scriptLoads.WithLabelValues(r.Why).Add(float64(r.Scripts))
	if r.Err != nil {
		d.log.Warn("could not load the scripts into redis", zap.String(keyNode, r.Addr), zap.String(keyWhy, r.Why),
			zap.Int(keyScripts, r.Scripts), zap.Error(r.Err))
		return
	}
	d.log.Info("loaded scripts into redis", zap.String(keyNode, r.Addr), zap.String(keyWhy, r.Why),
		zap.Int(keyScripts, r.Scripts), zap.Int(keyBytes, r.Bytes))
}

// Sharded reports whether the store spreads keys over a Redis Cluster's
// nodes, where a take whose checks are in several hash slots goes in
// steps and needs a request_id (steps.go).
func (d *Dispatcher) Sharded() bool {
	if d.store == nil || d.store.Kind() == store.StoreEmbedded {
		return false
	}
	c, err := d.store.Client()
	return err == nil && c.Mode() == rueidis.ClientModeCluster
}

// SetConfig swaps the policies in use. Decisions already resolved keep the
// config they started with; the next request sees the new one.
func (d *Dispatcher) SetConfig(c *policy.Config) { d.cfg.Store(c) }

// Config returns the policies in use.
func (d *Dispatcher) Config() *policy.Config { return d.cfg.Load() }

// Healed counts the keys the scripts found without a TTL and repaired.
func (d *Dispatcher) Healed() int64 { return d.healed.Load() }

func (d *Dispatcher) shutting() bool { return d.opts.Draining() }

// Decision is one take, peek, release or settle on its way through the
// dispatcher: Prepare resolves it, Run decides it, and Done is called once
// Out holds the answer.
//
// A decision is decided against a list of checks: a request without
// "checks" is a list of one, its own limits; a take with "checks" is one
// check per element (checks.go). Every rule (the verdict, shadow mode,
// on_unavailable, the local denial, metrics, the decision log, the header
// fields) is written once, over the list. What differs is only the script
// call: a lone check goes to Redis as its own script, several as one take
// of all of them (route.go), and the reply's shape (Outcome.AppendReply).
type Decision struct {
	Out Outcome
	// Done is called once, from whichever goroutine decided, when Out is
	// final. It must not block.
	Done func()

	req *protocol.Request
	cfg *policy.Config // the config the request was resolved under
	// checks are what the request is decided against, in order; their
	// outcomes are Out.check(i). For a request without "checks" it is one
	// array's element, one, so a take of one limit allocates nothing.
	checks []check
	one    [1]check
	// call is the decision's one script call: its lone check's own, or the
	// take of all its checks (luascript.TakeChecksCall).
	call luascript.Call
	// digest names a take's set of checks in each check's request-id
	// record, so that a retry with another set is CONFLICT ("" without a
	// request_id, and for a lone check).
	digest string
	// crossSlot: the checks' keys are in several Redis Cluster hash
	// slots, so that no one script can take them all (steps.go).
	crossSlot bool
	// traced: the request carried a trace context (read once, while the
	// request is at hand).
	traced bool
	start  time.Time // when Prepare began, for the latency metric
	queued time.Time // when Run began: the Redis deadline counts from here
	// trip is the timing of the decision's latest script call (route.go).
	trip trip
	// span is the decision's span, nil when tracing is off (trace.go).
	span trace.Span
	// given are the limits the caller resolved itself (PrepareGiven),
	// one per check, nil for a check resolved as a request's; nil when
	// none was given.
	given []*Given
}

// Given is a check's limit as a caller that resolves its own limits
// gives it (Envoy's rate limit service, rls/, from its descriptors file)
// instead of a policy name or inline limits.
type Given struct {
	// Shape is the limit; it must have passed Validate.
	Shape limits.Shape
	// Name stands for a policy's name: in the outcome, the metrics'
	// policy label and the header fields. Its values must be few (the
	// caller's configuration's), and it is never empty.
	Name string
	// Counter names the state the check counts against; its key
	// (luascript.EnvoyCalendarKey) is one no policy's or inline limit's
	// can equal. Only a calendar window (a period counted from the epoch)
	// may be given.
	Counter string
	Shadow  bool
	// GiveBack gives the check's cost back to its window instead of
	// taking it (Envoy's negative hits): its request is a peek, answered
	// as one with the window after. Not idempotent.
	GiveBack bool
	// Period, with GiveBack, pins the give back to the window starting
	// then (Unix ms; 0 for the window holding Redis's clock): it gives
	// back only while Redis's clock is in that window, and otherwise
	// touches nothing (a peek's answer of no window).
	Period int64
}

// check is one limit a decision is decided against.
type check struct {
	req   *protocol.Request // the decision's request, or its element of Checks
	limit Limit
	key   string
	call  luascript.Call // the check's own take, peek, release or settle
	// denyGen is the local denial's count of settles on the key's shard
	// when a take ran: a denial found after a settle is not remembered.
	denyGen uint64
	// sent is when the call that answered the check was sent (a take in
	// steps sends several): its local denial counts from here.
	sent time.Time
}

// givenOf is check i's given limit, nil when it has none.
func (dec *Decision) givenOf(i int) *Given {
	if i < len(dec.given) {
		return dec.given[i]
	}
	return nil
}

// givesBack reports whether dec gives back to a window (Given.GiveBack).
func (dec *Decision) givesBack() bool {
	g := dec.givenOf(0)
	return g != nil && g.GiveBack
}

// listed reports whether the request gave "checks": its reply has one
// member per check.
func (dec *Decision) listed() bool { return dec.Out.Checks != nil }

// out is the outcome of check i.
func (dec *Decision) out(i int) *Outcome { return dec.Out.check(i) }

// key is the Redis key the decision's script call is routed by: its first
// check's.
func (dec *Decision) key() string { return dec.checks[0].key }

// AppendKeys appends to dst the Redis keys dec decides on, one per check,
// for the same-key order.
func (dec *Decision) AppendKeys(dst []string) []string {
	for i := range dec.checks {
		dst = append(dst, dec.checks[i].key)
	}
	return dst
}

// Prepare resolves req's limits, checks that their algorithms can do it
// and builds its script call. It reports the Redis key the decision is
// routed by. decided is true when the request is refused (Out holds the
// error and Done was called): then dec must not be touched, and Run not
// called.
func (d *Dispatcher) Prepare(req *protocol.Request, dec *Decision) (key string, decided bool) {
	return d.prepare(req, nil, dec)
}

// PrepareGiven is Prepare for a take or peek some of whose checks' limits
// the caller resolved itself: given[i], when not nil, is the limit of
// check i (of req.Checks, or req itself when it has none), whose Policy
// and inline limits are then not read. Everything after (the route, the
// verdict, shadow mode, the local denial, metrics, spans) is Prepare's.
func (d *Dispatcher) PrepareGiven(req *protocol.Request, given []*Given, dec *Decision) (key string, decided bool) {
	return d.prepare(req, given, dec)
}

func (d *Dispatcher) prepare(req *protocol.Request, given []*Given, dec *Decision) (key string, decided bool) {
	// Cleared, then set: a composite literal of this size is built aside
	// and copied.
	done := dec.Done
	*dec = Decision{}
	dec.Done, dec.req, dec.given, dec.traced = done, req, given, req.Trace.Valid()
	dec.Out.Op, dec.Out.Headers = req.Op, req.Headers
	if d.tracer != nil {
		dec.start = time.Now() // the span's start, shown
		d.startSpan(dec)
	} else {
		dec.start = monoNow()
	}
	d.metrics.inflight.Inc()
	dec.cfg = d.cfg.Load()
	if n := len(req.Checks); n > 0 {
		dec.checks = make([]check, n)
		dec.Out.Checks = make([]Outcome, n)
		for i := range dec.checks {
			dec.checks[i].req = &req.Checks[i]
		}
	} else {
		dec.checks = dec.one[:]
		dec.checks[0].req = req
	}
	for i := range dec.checks {
		if err := d.prepareCheck(dec, i); err != nil {
			d.end(dec, dec.checkErr(i, err))
			return "", true
		}
	}
	dec.call = dec.checks[0].call
	if dec.listed() {
		call, err := d.takeOfChecks(dec)
		if err != nil {
			d.end(dec, err)
			return "", true
		}
		dec.call = call
	}
	return dec.key(), false
}

// prepareCheck resolves check i of dec and builds its call.
func (d *Dispatcher) prepareCheck(dec *Decision, i int) error {
	c, o, l := &dec.checks[i], dec.out(i), &dec.checks[i].limit
	g := dec.givenOf(i)
	if g != nil {
		if g.Shape.Algorithm() != limits.Calendar {
			return &protocol.Error{Code: protocol.CodeInternal, Message: "a given limit is a calendar window, not " + strconv.Quote(g.Shape.Algorithm())}
		}
		var alg Algorithm = calendar{}
		if g.GiveBack {
			alg = givingBack{period: g.Period}
		}
		*l = Limit{Algorithm: forOp(c.req.Op, alg), Shape: g.Shape, Policy: g.Name, Shadow: g.Shadow, MaxRequestIDs: limits.DefaultMaxRequestIDs}
	} else if err := d.resolve(c.req, dec.cfg, l); err != nil {
		return err
	}
	o.Op, o.Algorithm, o.Policy, o.Limit = c.req.Op, l.Algorithm.Name(), l.Policy, l.Shape.Quota()
	o.Headers, o.Shape = dec.req.Headers, l.Shape
	if g != nil {
		c.key = luascript.EnvoyCalendarKey(d.opts.KeyPrefix, g.Counter)
	} else {
		c.key = l.Algorithm.Key(d.opts.KeyPrefix, l.Policy, c.req.Subject)
	}
	var err error
	c.call, err = l.Algorithm.Call(c.req, l, c.key)
	return err
}

// resolve finds the limits req is decided against.
func (d *Dispatcher) resolve(req *protocol.Request, cfg *policy.Config, l *Limit) error {
	if req.Policy != "" {
		p, ok := cfg.Policies[req.Policy]
		if !ok {
			return &protocol.Error{Code: protocol.CodeUnknownPolicy, Message: "no policy named " + strconv.Quote(req.Policy) + " in the config"}
		}
		*l = Limit{
			Shape: p.Shape(), Policy: p.Name, Shadow: p.Mode == policy.ModeShadow,
			OnUnavailable: p.OnUnavailable, MaxRequestIDs: p.MaxRequestIDs, DedupeMS: p.DedupeMS, Allotment: p.Allotment,
		}
	} else {
		if !d.opts.AllowInline {
			return invalid("inline limits are disabled on this sidecar: name a policy")
		}
		*l = Limit{Shape: req.InlineShape(), MaxRequestIDs: limits.DefaultMaxRequestIDs}
		if b, ok := l.Shape.(limits.Bucket); ok {
			// Inline buckets remember a request id for one refill.
			l.DedupeMS = b.RefillMS()
		}
	}
	alg, ok := algorithms[l.Shape.Algorithm()]
	if !ok {
		return &protocol.Error{Code: protocol.CodeInternal, Message: "unknown algorithm " + strconv.Quote(l.Shape.Algorithm())}
	}
	l.Algorithm = forOp(req.Op, alg)
	return nil
}

// Run decides a prepared decision: from the local denial when it can, or
// by sending its call to Redis (route.go). Done is called when it is
// decided, possibly before Run returns.
func (d *Dispatcher) Run(dec *Decision) {
	dec.queued = monoNow()
	req := dec.req
	switch req.Op {
	case protocol.OpSettle:
		d.deny.forget(dec.key())
	case protocol.OpPeek:
		if dec.givesBack() {
			d.deny.forget(dec.key())
		}
	case protocol.OpTake:
		for i := range dec.checks {
			c := &dec.checks[i]
			c.denyGen = d.deny.generation(c.key)
		}
		if req.RequestID == "" && d.allotted(dec) {
			return
		}
		if req.RequestID == "" && d.localDenied(dec) {
			// Known to be denied: this answer holds while Redis is down too.
			d.metrics.localDenials.Inc()
			d.finish(dec)
			return
		}
	}
	d.send(dec)
}

// complete answers dec from the reply res to its call.
func (d *Dispatcher) complete(dec *Decision, res rueidis.RedisResult) {
	_, err := d.read(dec, allChecks[:len(dec.checks)], res)
	d.observe(dec.key(), err, &dec.trip)
	if err != nil {
		d.end(dec, err)
		return
	}
	d.conclude(dec)
}

// allChecks are the indexes of every check of a decision, up to
// limits.MaxChecks.
var allChecks = func() (idx [limits.MaxChecks]int) {
	for i := range idx {
		idx[i] = i
	}
	return idx
}()

// read reads res, Redis's reply to the call of dec's checks idx (all of
// them, or one step's, steps.go), into their outcomes. It reports whether
// every check among them that is not a shadow one accepted.
func (d *Dispatcher) read(dec *Decision, idx []int, res rueidis.RedisResult) (accepted bool, err error) {
	var one [1]rueidis.RedisResult
	replies, applied := one[:], true
	if dec.listed() {
		r, err := luascript.ParseTakeChecks(res, len(idx))
		if err != nil {
			return false, err
		}
		replies, applied = r.Checks, r.Applied
	} else {
		one[0] = res
	}
	accepted = true
	for j, i := range idx {
		c, o := &dec.checks[i], dec.out(i)
		c.sent = dec.trip.sent
		err := parseReply(c.req.Op, &c.limit, replies[j], o)
		if le, ok := err.(*luascript.Error); o.Healed || ok && le.Healed {
			d.log.Warn("restored the TTL of a quota key that had none", append([]zap.Field{zap.String(keyPolicy, c.limit.Policy),
				zap.String(keyKey, c.key), zap.Int64(keyHealedTotal, d.healed.Add(1))}, dec.traceLog()...)...)
		}
		if err != nil {
			return false, dec.checkErr(i, err)
		}
		accepted = accepted && (c.limit.Shadow || o.Allowed)
	}
	if dec.listed() && accepted != applied {
		return false, malformedReply("take of checks: applied " + strconv.FormatBool(applied) +
			" but the checks' verdicts say " + strconv.FormatBool(accepted))
	}
	return accepted, nil
}

// conclude answers dec once Redis answered its checks (but those
// skipped): a take's answers feed the local denial of their keys, shadow
// mode turns each, and the take's verdict is written over them.
func (d *Dispatcher) conclude(dec *Decision) {
	if dec.Out.Op == protocol.OpTake {
		for i := range dec.checks {
			c, o := &dec.checks[i], dec.out(i)
			if o.Skipped {
				continue
			}
			hold, need := c.limit.Algorithm.DeniedFor(o, c.req.Cost)
			d.deny.record(dec, i, hold, need)
			o.applyShadow(c.limit.Shadow)
		}
		dec.verdict()
	}
	d.finish(dec)
}

// finish counts a decided request and hands it back.
func (d *Dispatcher) finish(dec *Decision) {
	if (dec.Out.Op == protocol.OpSettle || dec.givesBack()) && dec.key() != "" {
		// Applied or maybe applied: what a denial said may no longer hold.
		d.deny.forget(dec.key())
	}
	d.metrics.observe(dec)
	if dec.span != nil {
		d.endSpan(dec)
	}
	dec.Done()
}
