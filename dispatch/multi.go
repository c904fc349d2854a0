package dispatch

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/zap"

	"quotad/keyslot"
	"quotad/limits"
	"quotad/luascript"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

// A take of several limits ("checks", protocol/checks.go) is one
// Decision: each check resolves, builds its take's call and reads its
// reply as a take of one limit would (its Algorithm), and the calls go to
// Redis as one script (luascript.MultiTakeCall) that takes every check or
// none. How the features of a take of one limit combine:
//
//   - The verdict: the take is allowed when every check that is not in
//     shadow mode accepts; then every check that accepts consumes. When
//     one denies, none consumes. Its retry_after_ms is the largest of the
//     denying checks'.
//   - Shadow mode is per check: a check of a shadow policy never denies
//     the take; its own verdict is its shadow_allowed, and it consumes
//     when it accepts and the take is allowed.
//   - The local denial is per check: a take without request_id whose
//     check (not a shadow one) is known to deny is denied without Redis;
//     the checks not asked are "skipped". Every check's answer from Redis
//     feeds the local denial of its key.
//   - on_unavailable: a take Redis did not decide is UNAVAILABLE unless
//     every check's policy says allow or deny. Then it is degraded, and
//     denied when a check that is not a shadow one says deny.
//   - Metrics count the take once in quotad_requests_total and each check
//     in quotad_decisions_total, under its policy and algorithm; a check
//     that accepted in a take another check denied counts as unapplied,
//     a skipped one as skipped. The decision log writes a line per check.
//   - Headers: every check is a member of RateLimit-Policy and RateLimit,
//     in order (a skipped one of RateLimit-Policy only).
//
// Replays: the take's request_id is each check's; a retry replays every
// check; a retry with another set of checks or costs is CONFLICT, since
// each check's record keeps the digest of the set (multiDigest).

// Results of a check of a multi-limit take, beside those of Outcome.Result.
const (
	// ResultUnapplied: the check accepted, but another check denied the
	// take, so nothing was consumed.
	ResultUnapplied = "unapplied"
	// ResultSkipped: the take was denied locally by another check before
	// this one was asked.
	ResultSkipped = "skipped"
)

// multi is what a Decision of a multi-limit take holds beyond a take's:
// each check's request (an element of the take's Checks), limits and key.
// Their outcomes are the take's Out.Checks, in the same order.
type multi struct {
	checks []multiCheck
	// calls are the checks' take calls, and digest the set's, for the
	// steps of a take whose keys are in several slots (multi_steps.go).
	calls  []luascript.MultiCheck
	digest string
	// crossSlot: the checks' keys are in several Redis Cluster hash slots.
	crossSlot bool
}

type multiCheck struct {
	req   *protocol.Request
	limit Limit
	key   string
	// denyGen is as a single take's (Decision.denyGen), for the check's key.
	denyGen uint64
}

// checkErr names check i (from 0) in err's message.
func checkErr(i int, err error) error {
	name := "check " + strconv.Itoa(i+1) + ": "
	if pe, ok := errors.AsType[*protocol.Error](err); ok {
		return &protocol.Error{Code: pe.Code, Message: name + pe.Message}
	}
	if le, ok := errors.AsType[*luascript.Error](err); ok {
		return &luascript.Error{Code: le.Code, Message: name + le.Message, Healed: le.Healed}
	}
	return err
}

// prepareMulti is Prepare of a take of checks.
func (d *Dispatcher) prepareMulti(req *protocol.Request, dec *Decision) (string, bool) {
	n := len(req.Checks)
	m := &multi{checks: make([]multiCheck, n)}
	dec.multi = m
	dec.Out.Headers = req.Headers
	dec.Out.Checks = make([]Outcome, n)
	calls := make([]luascript.MultiCheck, n)
	parts := make([]string, n)
	slot := -1
	for i := range m.checks {
		c := &m.checks[i]
		c.req = &req.Checks[i]
		if err := d.resolve(c.req, dec.cfg, &c.limit); err != nil {
			return d.refuse(dec, checkErr(i, err))
		}
		l := &c.limit
		dec.Out.Checks[i] = Outcome{
			Op: protocol.OpTake, Algorithm: l.Algorithm.Name(), Policy: l.Policy, Limit: l.Shape.Quota(),
			Headers: req.Headers, Shape: l.Shape,
		}
		c.key = l.Algorithm.Key(d.opts.KeyPrefix, l.Policy, c.req.Subject)
		call, err := l.Algorithm.Call(c.req, l, c.key)
		if err != nil {
			return d.refuse(dec, checkErr(i, err))
		}
		calls[i] = luascript.MultiCheck{Call: call, Shadow: l.Shadow}
		parts[i] = multiDigestPart(l.Algorithm.Name(), c.key, c.req.Cost)
		if s := int(keyslot.Of(c.key)); slot >= 0 && s != slot {
			m.crossSlot = true
		} else {
			slot = s
		}
	}
	digest := ""
	if req.RequestID != "" {
		digest = luascript.MultiDigest(parts)
	}
	call, err := luascript.MultiTakeCall(calls, req.RequestID, digest)
	if err != nil {
		return d.refuse(dec, err)
	}
	m.calls, m.digest = calls, digest
	dec.call, dec.key = call, m.checks[0].key
	return dec.key, false
}

// multiDigestPart is what the digest of a take's set of checks says of one
// check: its algorithm, key and cost. Its limits are left out, so that a
// retry after a policy's limits changed is still the same take.
func multiDigestPart(algorithm, key string, cost int64) string {
	return algorithm + " " + strconv.FormatInt(cost, 10) + " " + key
}

// refuse answers a decision Prepare refused.
func (d *Dispatcher) refuse(dec *Decision, err error) (string, bool) {
	d.fail(&dec.Out, err)
	d.finish(dec)
	return "", true
}

// AppendKeys appends to dst the Redis keys dec decides on, for the
// same-key order: its checks' keys, or the one key Prepare returned.
func (dec *Decision) AppendKeys(dst []string) []string {
	if dec.multi == nil {
		return append(dst, dec.key)
	}
	for _, c := range dec.multi.checks {
		dst = append(dst, c.key)
	}
	return dst
}

// sendableMulti is sendable's extra condition for a take of checks: on a
// Redis Cluster, one whose keys are in several slots is taken a slot at a
// time, which needs a request_id. The embedded store is one node holding
// every slot, which runs any take whole.
func (d *Dispatcher) sendableMulti(dec *Decision) error {
	if dec.multi == nil || !dec.multi.crossSlot || d.store.Kind() == store.StoreEmbedded {
		return nil
	}
	client, err := d.store.Client()
	if err != nil {
		return err
	}
	if client.Mode() == rueidis.ClientModeCluster && dec.req.RequestID == "" {
		return errStepsNeedID
	}
	return nil
}

// oneNode reports whether dec must be sent by itself, not in a batch: a
// take whose keys are in several slots, on a store whose client routes by
// slot (the embedded store, or a Redis Cluster, where it goes in steps).
func (d *Dispatcher) oneNode(dec *Decision) bool {
	if dec.multi == nil || !dec.multi.crossSlot {
		return false
	}
	client, err := d.store.Client()
	return err == nil && client.Mode() == rueidis.ClientModeCluster
}

// runOnOneNodeOrSteps sends dec, a take whose keys are in several slots:
// whole to the embedded store's one node, a slot at a time to a Redis
// Cluster (multi_steps.go).
func (d *Dispatcher) runOnOneNodeOrSteps(dec *Decision) {
	if d.store.Kind() == store.StoreEmbedded {
		d.aloneOnOneNode(dec)
		return
	}
	d.steps(dec)
}

// aloneOnOneNode sends dec by itself with luascript's ExecOnOneNode, under
// the deadline a batch would give it.
func (d *Dispatcher) aloneOnOneNode(dec *Decision) {
	client, err := d.store.Client()
	if err != nil {
		d.undecided(dec, err)
		d.finish(dec)
		return
	}
	timeout := d.opts.RedisTimeout
	if t := time.Duration(dec.req.TimeoutMS) * time.Millisecond; t > 0 && t < timeout {
		timeout = t
	}
	ctx, cancel := context.WithTimeout(d.opts.Context, timeout)
	defer cancel()
	dec.sent = time.Now()
	d.complete(dec, dec.call.ExecOnOneNode(ctx, d.metrics.instrument(client)), timeout < d.opts.RedisTimeout)
}

// localDenied answers dec from the local denial when it can: a take of one
// limit, or of checks one of which (not a shadow one) is known to deny.
func (d *Dispatcher) localDenied(dec *Decision) bool {
	if dec.multi == nil {
		if !d.deny.answer(dec, dec.queued) {
			return false
		}
		dec.Out.applyShadow(dec.limit.Shadow)
		return true
	}
	m := dec.multi
	for i := range m.checks {
		c := &m.checks[i]
		if c.limit.Shadow {
			continue
		}
		one := d.checkDecision(dec, i)
		if !d.deny.answer(&one, dec.queued) {
			continue
		}
		o := &dec.Out
		o.Checks[i] = one.Out
		for j := range m.checks {
			if j != i {
				oc := &o.Checks[j]
				oc.Allowed, oc.Skipped, oc.Remaining = true, true, oc.Limit
			}
		}
		o.Allowed, o.RetryAfterMS = false, one.Out.RetryAfterMS
		return true
	}
	return false
}

// checkDecision is check i of dec as a Decision of its own, for the local
// denial, which reads and records one key's decisions.
func (d *Dispatcher) checkDecision(dec *Decision, i int) Decision {
	c := &dec.multi.checks[i]
	return Decision{
		Out: dec.Out.Checks[i], req: c.req, limit: c.limit, key: c.key, cfg: dec.cfg,
		start: dec.start, queued: dec.queued, sent: dec.sent, denyGen: c.denyGen,
	}
}

// completeMulti is complete of a take of checks.
func (d *Dispatcher) completeMulti(dec *Decision, res rueidis.RedisResult, shortened bool) {
	m := dec.multi
	r, err := luascript.ParseMultiTake(res, len(m.checks))
	d.observe(dec.key, err, shortened)
	if err != nil {
		d.undecided(dec, err)
		d.finish(dec)
		return
	}
	all := make([]int, len(m.checks))
	for i := range all {
		all[i] = i
	}
	allowed, replay, err := d.parseChecks(dec, all, r)
	if err != nil {
		d.undecided(dec, err)
		d.finish(dec)
		return
	}
	d.finishMulti(dec, allowed, replay)
}

// parseChecks reads the replies r of the checks idx of dec into their
// outcomes: whether every check that is not a shadow one accepted, and
// every check replayed.
func (d *Dispatcher) parseChecks(dec *Decision, idx []int, r luascript.MultiTakeResult) (allowed, replay bool, err error) {
	m, o := dec.multi, &dec.Out
	allowed, replay = true, true
	for j, i := range idx {
		c, oc := &m.checks[i], &o.Checks[i]
		err := c.limit.Algorithm.Parse(c.req, &c.limit, r.Checks[j], oc)
		if oc.Healed {
			d.log.Warn("restored the TTL of a quota key that had none", zap.String(keyPolicy, c.limit.Policy),
				zap.String(keyKey, c.key), zap.Int64(keyHealedTotal, d.healed.Add(1)))
		}
		if err != nil {
			return false, false, checkErr(i, err)
		}
		if !c.limit.Shadow && !oc.Allowed {
			allowed = false
		}
		replay = replay && oc.Replay
	}
	if allowed != r.Applied {
		return false, false, malformedReply("multi take: applied " + strconv.FormatBool(r.Applied) +
			" but the checks' verdicts say " + strconv.FormatBool(allowed))
	}
	return allowed, replay, nil
}

// finishMulti answers dec, whose checks' outcomes are parsed: the take's
// verdict, the local denial of each check asked, what a denied take
// consumed (nothing), and shadow mode.
func (d *Dispatcher) finishMulti(dec *Decision, allowed, replay bool) {
	m, o := dec.multi, &dec.Out
	o.Allowed, o.Replay = allowed, allowed && replay
	for i := range m.checks {
		c, oc := &m.checks[i], &o.Checks[i]
		if !oc.Skipped {
			one := d.checkDecision(dec, i)
			hold, need := c.limit.Algorithm.DeniedFor(oc, c.req.Cost)
			d.deny.record(&one, hold, need)
		}
		if !allowed && !oc.Skipped {
			unapplied(oc, c.req.Cost)
			if !c.limit.Shadow && !oc.Allowed {
				o.RetryAfterMS = max(o.RetryAfterMS, oc.RetryAfterMS)
			}
		}
		oc.applyShadow(c.limit.Shadow)
	}
	d.finish(dec)
}

// unapplied makes the outcome of a check that accepted in a take that was
// denied say what was consumed: nothing. Its used and remaining are as
// they are (the script answered them as after consuming); its reset_ms is
// what it would have been.
func unapplied(o *Outcome, cost int64) {
	if !o.Allowed || o.Replay {
		return
	}
	if o.Algorithm == limits.Concurrency {
		cost, o.LeaseMS = 1, 0
	}
	o.Used, o.Remaining = max(o.Used-cost, 0), min(o.Remaining+cost, o.Limit)
}

// undecidedMulti is undecided of a take of checks: UNAVAILABLE, unless
// every check's policy answers for it (on_unavailable allow or deny).
func (d *Dispatcher) undecidedMulti(dec *Decision, err error) {
	o := &dec.Out
	d.fail(o, err)
	if o.Code != protocol.CodeUnavailable {
		return
	}
	deny := false
	for _, c := range dec.multi.checks {
		switch c.limit.OnUnavailable {
		case policy.OnUnavailableAllow:
		case policy.OnUnavailableDeny:
			deny = deny || !c.limit.Shadow
		default:
			return
		}
	}
	retry := max(d.store.ProbeInterval().Milliseconds(), 1)
	*o = Outcome{Op: o.Op, Degraded: true, Headers: o.Headers, Checks: o.Checks, Allowed: !deny}
	if deny {
		o.RetryAfterMS = retry
	}
	for i, c := range dec.multi.checks {
		oc := &o.Checks[i]
		*oc = Outcome{
			Op: oc.Op, Algorithm: oc.Algorithm, Policy: oc.Policy, Limit: oc.Limit, Remaining: oc.Limit, Degraded: true,
			Headers: oc.Headers, Shape: oc.Shape, Allowed: c.limit.OnUnavailable == policy.OnUnavailableAllow,
		}
		if !oc.Allowed {
			oc.RetryAfterMS = retry
		}
		oc.applyShadow(c.limit.Shadow)
	}
}

// appendMulti renders the reply of a take of checks.
func (o *Outcome) appendMulti(dst, id []byte) []byte {
	r := protocol.MultiTakeReply{
		Allowed: o.Allowed, Replay: o.Replay, RetryAfterMS: o.RetryAfterMS, Degraded: o.Degraded,
		Checks: make([]protocol.CheckReply, len(o.Checks)),
	}
	for i := range o.Checks {
		c := &o.Checks[i]
		r.Checks[i] = protocol.CheckReply{
			Allowed: c.Allowed, Replay: c.Replay, Limit: c.Limit, Used: c.Used, Remaining: c.Remaining,
			ResetMS: c.ResetMS, RetryAfterMS: c.RetryAfterMS, LeaseMS: c.LeaseMS,
			Shadow: c.Shadow, ShadowAllowed: c.ShadowAllowed, Degraded: c.Degraded, Skipped: c.Skipped,
		}
	}
	if o.Headers {
		r.Headers = o.multiHeaderFields()
	}
	return protocol.AppendMultiTake(dst, id, r)
}

// multiHeaderFields renders the header fields of a take of checks: one
// member per check in RateLimit-Policy, and in RateLimit but for skipped
// checks, whose state is unknown; none of RateLimit when degraded.
func (o *Outcome) multiHeaderFields() *protocol.HeaderFields {
	items := make([]headerItem, 0, len(o.Checks))
	known := make([]headerItem, 0, len(o.Checks))
	for i := range o.Checks {
		it := itemOf(&o.Checks[i])
		items = append(items, it)
		if !o.Checks[i].Skipped {
			known = append(known, it)
		}
	}
	h := renderHeaders(items, !o.Allowed, o.RetryAfterMS, false)
	if !o.Degraded {
		h.RateLimit = renderHeaders(known, !o.Allowed, o.RetryAfterMS, true).RateLimit
	}
	return h
}

// observeChecks counts each check of a finished take of checks, and logs
// it.
func (m *metrics) observeChecks(dec *Decision, elapsed time.Duration) {
	o := &dec.Out
	for i, c := range dec.multi.checks {
		oc := &o.Checks[i]
		result := oc.Result()
		switch {
		case o.Failed():
			result = string(o.Code)
		case oc.Skipped:
			result = ResultSkipped
		case !o.Allowed && !o.Degraded && !oc.Replay && (oc.Allowed && !oc.Shadow || oc.Shadow && oc.ShadowAllowed):
			result = ResultUnapplied
		}
		policy := ""
		if p := c.req.Policy; p != "" {
			if _, known := dec.cfg.Policies[p]; known {
				policy = p
			}
		}
		algorithm := ""
		if c.limit.Algorithm != nil {
			algorithm = c.limit.Algorithm.Name()
		}
		m.decisions.WithLabelValues(policy, algorithm, result).Inc()
		if m.decisionLog == nil || !m.logAll && !o.Denied() {
			continue
		}
		fields := []zap.Field{
			zap.String(keyOp, protocol.OpTake.String()),
			zap.Int(keyCheck, i+1),
			zap.String(keyAlgorithm, algorithm),
			zap.String(keyPolicy, c.req.Policy),
			zap.String(keySubject, c.req.Subject),
			zap.Int64(keyCost, c.req.Cost),
			zap.String(keyVerdict, result),
		}
		if !o.Failed() && !oc.Skipped {
			fields = append(fields, zap.Int64(keyLimit, oc.Limit), zap.Int64(keyUsed, oc.Used), zap.Int64(keyRemaining, oc.Remaining))
		}
		if dec.req.RequestID != "" {
			fields = append(fields, zap.String(keyRequestID, dec.req.RequestID))
		}
		if oc.Local {
			fields = append(fields, zap.Bool(keyLocal, true))
		}
		fields = append(fields, zap.Int64(keyLatencyUS, elapsed.Microseconds()))
		m.decisionLog.Info("decision", fields...)
	}
}

// keyCheck is the decision log key of a check's place in its take, from 1.
const keyCheck = "check"
