package dispatch

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
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
	d.metrics = newMetrics(d, opts)
	d.batch.start(d)
	return d
}

// Close stops the batcher once the decisions submitted are answered.
func (d *Dispatcher) Close() { d.batch.close() }

// SetConfig swaps the policies in use. Decisions already resolved keep the
// config they started with; the next request sees the new one.
func (d *Dispatcher) SetConfig(c *policy.Config) { d.cfg.Store(c) }

// Config returns the policies in use.
func (d *Dispatcher) Config() *policy.Config { return d.cfg.Load() }

// Healed counts the keys the scripts found without a TTL and repaired.
func (d *Dispatcher) Healed() int64 { return d.healed.Load() }

func (d *Dispatcher) shutting() bool { return d.opts.Draining() }

// Decision is one take, peek or release on its way through the
// dispatcher: Prepare resolves it, Run decides it, and Done is called once
// Out holds the answer.
type Decision struct {
	Out Outcome
	// Done is called once, from whichever goroutine decided, when Out is
	// final. It must not block.
	Done func()

	req    *protocol.Request
	limit  Limit
	key    string
	cfg    *policy.Config // the config the request was resolved under
	call   luascript.Call
	multi  *multi    // a take of several limits (multi.go); nil for one
	start  time.Time // when Prepare began, for the latency metric
	queued time.Time // when Run began: the Redis deadline counts from here
	sent   time.Time // when the call went to Redis, for the local denial
	// denyGen is the local denial's count of settles on the key's shard
	// when a take ran: a denial found after a settle is not remembered.
	denyGen uint64
}

// Prepare resolves req's limits, checks that its algorithm can do it and
// builds its script call. It reports the Redis key the decision is about.
// decided is true when the request is refused (Out holds the error and
// Done was called): then dec must not be touched, and Run not called.
func (d *Dispatcher) Prepare(req *protocol.Request, dec *Decision) (key string, decided bool) {
	*dec = Decision{Done: dec.Done, req: req, start: time.Now(), Out: Outcome{Op: req.Op}}
	d.metrics.inflight.Inc()
	cfg := d.cfg.Load()
	dec.cfg = cfg
	if len(req.Checks) > 0 {
		return d.prepareMulti(req, dec)
	}
	if err := d.resolve(req, cfg, &dec.limit); err != nil {
		d.fail(&dec.Out, err)
		d.finish(dec)
		return "", true
	}
	l := &dec.limit
	dec.Out.Algorithm, dec.Out.Policy, dec.Out.Limit = l.Algorithm.Name(), l.Policy, l.Shape.Quota()
	dec.Out.Headers, dec.Out.Shape = req.Headers, l.Shape
	dec.key = l.Algorithm.Key(d.opts.KeyPrefix, l.Policy, req.Subject)
	call, err := l.Algorithm.Call(req, l, dec.key)
	if err != nil {
		d.fail(&dec.Out, err)
		d.finish(dec)
		return "", true
	}
	dec.call = call
	return dec.key, false
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
			OnUnavailable: p.OnUnavailable, MaxRequestIDs: p.MaxRequestIDs, DedupeMS: p.DedupeMS,
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
// by sending its call to Redis in the next batch. Done is called when it
// is decided, possibly before Run returns.
func (d *Dispatcher) Run(dec *Decision) {
	dec.queued = time.Now()
	req := dec.req
	switch req.Op {
	case protocol.OpSettle:
		d.deny.forget(dec.key)
	case protocol.OpTake:
		dec.denyGen = d.deny.generation(dec.key)
		if dec.multi != nil {
			for i := range dec.multi.checks {
				c := &dec.multi.checks[i]
				c.denyGen = d.deny.generation(c.key)
			}
		}
	}
	if req.Op == protocol.OpTake && req.RequestID == "" && d.localDenied(dec) {
		// Known to be denied: this answer holds while Redis is down too.
		d.metrics.localDenials.Inc()
		d.finish(dec)
		return
	}
	if err := d.sendable(dec); err != nil {
		d.undecided(dec, err)
		d.finish(dec)
		return
	}
	if d.oneNode(dec) {
		go d.runOnOneNodeOrSteps(dec)
		return
	}
	if t := time.Duration(req.TimeoutMS) * time.Millisecond; t > 0 && t < d.opts.RedisTimeout {
		// A deadline of its own: it would shorten a batch's.
		go d.alone(dec, t)
		return
	}
	d.batch.submit(dec)
}

// sendable is nil when dec may be sent: the store is connected and the
// breaker of the Redis node that serves its key (on a Cluster; else of
// Redis) is closed.
func (d *Dispatcher) sendable(dec *Decision) error {
	if _, err := d.store.Client(); err != nil {
		return err
	}
	if err := d.sendableMulti(dec); err != nil {
		return err
	}
	return d.store.Admit(dec.key)
}

// alone sends one call with its own deadline. Running out of it says
// nothing about Redis's health: the caller chose it.
func (d *Dispatcher) alone(dec *Decision, timeout time.Duration) {
	client, err := d.store.Client()
	if err != nil {
		d.undecided(dec, err)
		d.finish(dec)
		return
	}
	ctx, cancel := context.WithTimeout(d.opts.Context, timeout)
	defer cancel()
	dec.sent = time.Now()
	d.complete(dec, dec.call.Exec(ctx, d.metrics.instrument(client)), true)
}

// complete answers dec from its call's result.
func (d *Dispatcher) complete(dec *Decision, res rueidis.RedisResult, shortened bool) {
	if dec.multi != nil {
		d.completeMulti(dec, res, shortened)
		return
	}
	l, o := &dec.limit, &dec.Out
	err := l.Algorithm.Parse(dec.req, l, res, o)
	d.observe(dec.key, err, shortened)
	if le, ok := err.(*luascript.Error); o.Healed || ok && le.Healed {
		d.log.Warn("restored the TTL of a quota key that had none", zap.String(keyPolicy, l.Policy),
			zap.String(keyKey, dec.key), zap.Int64(keyHealedTotal, d.healed.Add(1)))
	}
	if err != nil {
		d.undecided(dec, err)
		d.finish(dec)
		return
	}
	if o.Op == protocol.OpTake {
		hold, need := l.Algorithm.DeniedFor(o, dec.req.Cost)
		d.deny.record(dec, hold, need)
		o.applyShadow(l.Shadow)
	}
	d.finish(dec)
}

// finish counts a decided request and hands it back.
func (d *Dispatcher) finish(dec *Decision) {
	if dec.Out.Op == protocol.OpSettle && dec.key != "" {
		// Applied or maybe applied: what a denial said may no longer hold.
		d.deny.forget(dec.key)
	}
	d.metrics.observe(dec)
	dec.Done()
}
