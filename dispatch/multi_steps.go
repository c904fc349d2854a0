package dispatch

import (
	"context"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/zap"

	"quotad/keyslot"
	"quotad/luascript"
	"quotad/protocol"
)

// A take of several limits whose keys are in several hash slots of a
// Redis Cluster cannot be one script: no node holds them all. It is taken
// in steps, one script per slot, that never over-admit and leave nothing
// behind when the take is denied or fails:
//
//  1. The checks are grouped by slot, in the order their slots first
//     appear among the checks. Each group is one multitake.lua call on its
//     master, all or nothing within the group, as on one Redis: so no
//     budget ever admits more than its limit, whatever runs meanwhile.
//  2. The groups run one after the other. When every group accepts, the
//     take is allowed. When one denies (or fails), the groups already
//     accepted are given back (multitake_giveback.lua): each check that
//     consumed in this take (not a replay) gets its cost back, found by
//     the request-id record the take wrote, and the checks of the groups
//     not run are "skipped".
//
// The take needs a request_id: the records it names are what a give back
// finds, and a retry after a lost reply replays the groups that were
// accepted. While a take is between steps, its accepted groups hold their
// cost: other takes may be denied for it meanwhile (never admitted for
// it). If the sidecar dies between two steps, or a give back cannot
// reach Redis, a group keeps what it took, for no longer than its own
// limits keep any take: its window or calendar period ends, its bucket
// refills the cost, its sliding window slides it out, its lease expires. A
// retry with the same request_id replays the accepted groups and takes the
// others, completing the take, or gives them back on a denial.

// errStepsNeedID refuses a take whose keys are in several slots without a
// request_id.
var errStepsNeedID = &protocol.Error{Code: protocol.CodeInvalid, Message: "a take whose checks are in several hash slots of a " +
	"Redis Cluster needs a request_id: it is taken a slot at a time, and the request_id names what a denial gives back " +
	"(or give every check's subject the same hash tag, such as {tenant-42}, for one script)"}

// slotGroups are the checks of m by hash slot, in the order their slots
// first appear.
func (m *multi) slotGroups() [][]int {
	var groups [][]int
	at := map[uint16]int{}
	for i, c := range m.checks {
		s := keyslot.Of(c.key)
		g, ok := at[s]
		if !ok {
			g = len(groups)
			at[s] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

func (m *multi) pick(idx []int) []luascript.MultiCheck {
	out := make([]luascript.MultiCheck, len(idx))
	for j, i := range idx {
		out[j] = m.calls[i]
	}
	return out
}

// steps decides dec, a take whose keys are in several slots, a slot at a
// time.
func (d *Dispatcher) steps(dec *Decision) {
	m, o, req := dec.multi, &dec.Out, dec.req
	client, err := d.store.Client()
	if err != nil {
		d.undecided(dec, err)
		d.finish(dec)
		return
	}
	client = d.metrics.instrument(client)
	groups := m.slotGroups()
	var accepted [][]int
	allowed, replay := true, true
	fail := func(err error) {
		d.giveBack(client, dec, accepted)
		d.undecided(dec, err)
		d.finish(dec)
	}
	for gi, g := range groups {
		key := m.checks[g[0]].key
		if err := d.store.Admit(key); err != nil {
			fail(err)
			return
		}
		call, err := luascript.MultiTakeCall(m.pick(g), req.RequestID, m.digest)
		if err != nil {
			fail(err)
			return
		}
		ctx, cancel := context.WithTimeout(d.opts.Context, d.stepTimeout(req))
		dec.sent = time.Now()
		res := call.Exec(ctx, client)
		cancel()
		r, err := luascript.ParseMultiTake(res, len(g))
		d.observe(key, err, false)
		if err != nil {
			fail(err)
			return
		}
		ok, rep, err := d.parseChecks(dec, g, r)
		if err != nil {
			fail(err)
			return
		}
		replay = replay && rep
		if !ok {
			allowed = false
			for _, later := range groups[gi+1:] {
				for _, i := range later {
					oc := &o.Checks[i]
					oc.Allowed, oc.Skipped, oc.Remaining = true, true, oc.Limit
				}
			}
			break
		}
		accepted = append(accepted, g)
	}
	if !allowed {
		d.giveBack(client, dec, accepted)
	}
	d.finishMulti(dec, allowed, replay)
}

// stepTimeout is the deadline of one step: --redis-timeout, or the
// request's shorter timeout_ms.
func (d *Dispatcher) stepTimeout(req *protocol.Request) time.Duration {
	if t := time.Duration(req.TimeoutMS) * time.Millisecond; t > 0 && t < d.opts.RedisTimeout {
		return t
	}
	return d.opts.RedisTimeout
}

// giveBack gives back what the accepted groups' checks consumed in this
// take: those that accepted and did not replay. One that cannot be given
// back keeps its cost until its limits free it (see above), and is logged.
func (d *Dispatcher) giveBack(client rueidis.Client, dec *Decision, groups [][]int) {
	m, o := dec.multi, &dec.Out
	for _, g := range groups {
		var idx []int
		for _, i := range g {
			if oc := &o.Checks[i]; oc.Allowed && !oc.Replay {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			continue
		}
		call, err := luascript.MultiGiveBackCall(m.pick(idx), dec.req.RequestID, m.digest)
		var given []bool
		if err == nil {
			ctx, cancel := context.WithTimeout(d.opts.Context, d.opts.RedisTimeout)
			given, err = luascript.ParseMultiGiveBack(call.Exec(ctx, client), len(idx))
			cancel()
		}
		for j, i := range idx {
			if err != nil || !given[j] {
				d.log.Warn("could not give back a check of a denied take: it holds its cost until its limits free it",
					zap.String(keyKey, m.checks[i].key), zap.String(keyRequestID, dec.req.RequestID), zap.Error(err))
			}
		}
	}
}
