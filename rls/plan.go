package rls

import (
	"errors"
	"strconv"
	"strings"
	"sync"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"quotad/dispatch"
	"quotad/limits"
	"quotad/protocol"
	"quotad/rls/descriptors"
)

// A plan is what a request asks, before anything is decided: per request
// descriptor, its limit and where its answer comes from; the checks of
// the one take and the peeks (cost 0) beside it.
type plan struct {
	domain string
	items  []item
	checks []check
	// peeks are the descriptors of cost 0, and the give backs (negative
	// hits): each its own decision, beside the take.
	peeks []check
	// denied: a descriptor that is neither in shadow nor quota mode is
	// over its limit before anything is asked (a cost above it): the
	// request is OVER_LIMIT and its takes are only peeked, so that it
	// consumes nothing.
	denied bool
	// The room of the items, checks and given limits of a call of a
	// few descriptors, allocated with the plan.
	itemRoom  [smallPlan]item
	checkRoom [smallPlan]check
	givenRoom [smallPlan]dispatch.Given
	givens    int
	// runs are the decisions run for the call (Service.start).
	runs []*run
}

var planPool = sync.Pool{New: func() any { return new(plan) }}

// newPlan is an empty plan, reused when one is free.
func newPlan() *plan {
	p := planPool.Get().(*plan)
	runs := p.runs[:0]
	*p = plan{runs: runs}
	return p
}

// freePlan puts p back; nothing may hold it or its given limits.
func freePlan(p *plan) {
	runs := p.runs[:0]
	*p = plan{runs: runs}
	planPool.Put(p)
}

// smallPlan is the number of descriptors a plan has room for without
// allocating more: Envoy's routes send a few.
const smallPlan = 4

// given is a given limit of p's.
func (p *plan) given(g dispatch.Given) *dispatch.Given {
	if p.givens < len(p.givenRoom) {
		p.givenRoom[p.givens] = g
		p.givens++
		return &p.givenRoom[p.givens-1]
	}
	return &g
}

// item is one request descriptor's part of a plan.
type item struct {
	limit     *descriptors.RateLimit // nil: no limit applies, status OK
	unlimited bool
	// check is the index of its check in plan.checks, or of its peek in
	// plan.peeks (peek), -1 for neither.
	check int
	peek  bool
	// empty: its limit is 0 and it costs nothing: OK, nothing remains.
	empty bool
	// override: its limit is the request's own.
	override bool
}

// check is one counter a plan takes from or peeks at.
type check struct {
	req   protocol.Request
	given *dispatch.Given // nil for a quotad policy's
	quota bool
	limit *descriptors.RateLimit
	// over: its cost is above its limit, known without asking; it is
	// never sent. shadow: its limit is in shadow mode (the file's
	// shadow_mode, or its quotad policy's mode).
	over, shadow bool
}

// planOf maps req onto cfg. Its error is the call's INVALID_ARGUMENT.
func planOf(cfg *table, req *rlsv3.RateLimitRequest, quotaOf func(policy string) (quota int64, shadow, ok bool)) (*plan, error) {
	if req.GetDomain() == "" {
		return nil, invalidf("domain must not be empty")
	}
	if len(req.GetDomain()) > limits.MaxRLSValueBytes {
		return nil, invalidf("domain is longer than %d bytes", limits.MaxRLSValueBytes)
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return nil, invalidf("descriptors must not be empty")
	}
	if len(ds) > limits.MaxRLSDescriptors {
		return nil, invalidf("%d descriptors: at most %d", len(ds), limits.MaxRLSDescriptors)
	}
	p := newPlan()
	p.domain = req.GetDomain()
	if len(ds) <= smallPlan {
		p.items, p.checks = p.itemRoom[:len(ds)], p.checkRoom[:0]
	} else {
		p.items, p.checks = make([]item, len(ds)), make([]check, 0, len(ds))
	}
	dom, known := cfg.domain(p.domain)
	var entries [limits.MaxRLSEntries]descriptors.Entry
	replaced := map[string]bool(nil)
	for i, d := range ds {
		it := &p.items[i]
		it.check = -1
		es := d.GetEntries()
		if len(es) == 0 {
			return nil, invalidf("descriptor %d has no entries", i+1)
		}
		if len(es) > limits.MaxRLSEntries {
			return nil, invalidf("descriptor %d has %d entries: at most %d", i+1, len(es), limits.MaxRLSEntries)
		}
		for j, e := range es {
			switch {
			case e.GetKey() == "":
				return nil, invalidf("descriptor %d entry %d: empty key", i+1, j+1)
			case len(e.GetKey()) > limits.MaxRLSKeyBytes:
				return nil, invalidf("descriptor %d entry %d: key longer than %d bytes", i+1, j+1, limits.MaxRLSKeyBytes)
			case len(e.GetValue()) > limits.MaxRLSValueBytes:
				return nil, invalidf("descriptor %d entry %d: value longer than %d bytes", i+1, j+1, limits.MaxRLSValueBytes)
			}
			entries[j] = descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if o := d.GetLimit(); o != nil && known {
			rl, err := overrideOf(o)
			if err != nil {
				return nil, invalidf("descriptor %d: %s", i+1, err.Error())
			}
			it.limit, it.override = rl, true
			p.checks = append(p.checks, check{given: p.given(dispatch.Given{Counter: counterKey(p.domain, entries[:len(es)])})})
			it.check = len(p.checks) - 1
		} else if m, ok := cfg.cfg.Match(p.domain, entries[:len(es)]); ok {
			it.limit = m.Limit
			if m.Limit.Unlimited {
				it.unlimited = true
			} else if m.Limit.Policy != "" {
				subject := es[len(es)-1].GetValue()
				if subject == "" || len(subject) > limits.MaxSubjectBytes {
					return nil, invalidf("descriptor %d: the value of its last entry is the subject of policy %q: 1 to %d bytes",
						i+1, m.Limit.Policy, limits.MaxSubjectBytes)
				}
				p.checks = append(p.checks, check{req: protocol.Request{Policy: m.Limit.Policy, Subject: subject}})
				it.check = len(p.checks) - 1
			} else {
				p.checks = append(p.checks, check{given: p.given(dispatch.Given{Counter: m.Key, Shadow: m.Limit.ShadowMode})})
				it.check = len(p.checks) - 1
			}
			for _, r := range m.Limit.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[r] = true
			}
		}
		if it.check < 0 {
			continue
		}
		c := &p.checks[it.check]
		c.limit, c.quota = it.limit, it.limit.QuotaMode
		c.req.Op, c.req.Cost = protocol.OpTake, costOf(req, d)
		if c.req.Cost > limits.MaxLimit {
			return nil, invalidf("descriptor %d: hits_addend %d: at most %d", i+1, c.req.Cost, limits.MaxLimit)
		}
		if d.GetIsNegativeHits() {
			if c.given == nil {
				return nil, invalidf("descriptor %d: is_negative_hits gives back to a limit of the file, not to quotad policy %q", i+1, c.req.Policy)
			}
			c.given.GiveBack = true
		}
		if c.given != nil {
			c.given.Name = dom.name
			c.req.Subject = c.given.Counter
			// The domain is the hash tag of its counters: on a Redis
			// Cluster a call's counters of one domain are in one slot,
			// taken by one script.
			c.given.Counter = dom.tag + c.given.Counter
		}
	}
	// replaces drops the limits it names among the request's.
	if replaced != nil {
		for i := range p.items {
			it := &p.items[i]
			if it.limit != nil && !it.unlimited && it.limit.Name != "" && replaced[it.limit.Name] {
				it.limit, it.check = nil, -1
			}
		}
	}
	return p, p.settle(quotaOf)
}

// settle gives each descriptor with a limit its place: merged with an
// earlier one of the same counter (a counter is taken once, at the sum of
// their costs), a peek when it costs nothing, known over its limit when
// it costs more than the limit holds, or a check of the take. quotaOf is
// the most a quotad policy's take may cost and whether it is in shadow
// mode (ok false: no such policy).
func (p *plan) settle(quotaOf func(policy string) (quota int64, shadow, ok bool)) error {
	// The checks are kept in place: a check's place among those kept is
	// never after its place among all.
	all := p.checks
	p.checks = all[:0]
	for i := range p.items {
		it := &p.items[i]
		if it.check < 0 {
			continue
		}
		c := all[it.check]
		if c.given != nil {
			mult := max(int64(c.limit.UnitMultiplier), 1)
			c.given.Shape = limits.EpochWindow(max(int64(c.limit.RequestsPerUnit), 1), c.limit.Unit.Seconds()*mult)
			if err := c.given.Shape.Validate(); err != nil {
				return invalidf("descriptor %d: %d per %d %s: %s", i+1, c.limit.RequestsPerUnit, mult, c.limit.Unit, err.Error())
			}
		}
		if c.req.Cost == 0 || c.given != nil && c.given.GiveBack {
			// A peek, or a give back (negative hits), beside the take.
			if c.given != nil && c.limit.RequestsPerUnit == 0 {
				// Nothing to peek at: no request ever fits.
				it.check, it.empty = -1, true
				continue
			}
			c.req.Op = protocol.OpPeek
			if c.req.Cost == 0 && c.given != nil {
				c.given.GiveBack = false
			}
			p.peeks = append(p.peeks, c)
			it.check, it.peek = len(p.peeks)-1, true
			continue
		}
		if j := p.counter(&c); j >= 0 {
			p.checks[j].req.Cost += c.req.Cost
			it.check = j
			continue
		}
		p.checks = append(p.checks, c)
		it.check = len(p.checks) - 1
	}
	if len(p.checks) > limits.MaxChecks {
		return invalidf("the descriptors match %d limits: at most %d are taken at once", len(p.checks), limits.MaxChecks)
	}
	for i := range p.checks {
		c := &p.checks[i]
		quota, shadow, ok := int64(c.limit.RequestsPerUnit), c.limit.ShadowMode, true
		if c.given == nil {
			quota, shadow, ok = quotaOf(c.req.Policy)
		}
		// More than the limit can ever hold: over it, whatever the state,
		// and never sent.
		c.over, c.shadow = ok && c.req.Cost > quota, shadow
		if c.over && !shadow && !c.quota {
			p.denied = true
		}
	}
	return nil
}

// counter is the place of the check of p that counts against c's
// counter, to merge descriptors that share one; -1 for none. A call has
// few checks: a scan is cheaper than a map.
func (p *plan) counter(c *check) int {
	for j := range p.checks {
		o := &p.checks[j]
		switch {
		case (o.given == nil) != (c.given == nil):
		case c.given != nil:
			if o.given.Counter == c.given.Counter {
				return j
			}
		case o.req.Policy == c.req.Policy && o.req.Subject == c.req.Subject:
			return j
		}
	}
	return -1
}

// costOf is a descriptor's cost: its own hits_addend when set (0 checks
// without consuming), else the request's, 0 meaning 1.
func costOf(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), limits.MaxLimit+1))
	}
	return max(int64(req.GetHitsAddend()), 1)
}

// overrideOf is a request descriptor's own limit, which replaces the
// file's: never in shadow or quota mode, without name or metadata.
func overrideOf(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (*descriptors.RateLimit, error) {
	u := descriptors.Unit(o.GetUnit())
	if u.Seconds() == 0 {
		return nil, errors.New("limit override: unit " + o.GetUnit().String() + " is not a unit")
	}
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = m.GetValue()
	}
	if mult < 1 || mult > limits.MaxRLSUnitMultiplier {
		return nil, errors.New("limit override: unit_multiplier must be 1 to " + strconv.Itoa(limits.MaxRLSUnitMultiplier))
	}
	return &descriptors.RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: u, UnitMultiplier: mult}, nil
}

// counterKey is the counter of domain and entries as descriptors.Match
// writes it for an exact match: each part length-prefixed.
func counterKey(domain string, entries []descriptors.Entry) string {
	var b strings.Builder
	part := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	part(domain)
	for _, e := range entries {
		part(e.Key)
		part(e.Value)
	}
	return b.String()
}
