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
//     appear among the checks. Each group is one take_checks.lua call on its
//     master, all or nothing within the group, as on one Redis: so no
//     budget ever admits more than its limit, whatever runs meanwhile.
//  2. The groups run one after the other. When every group accepts, the
//     take is allowed. When one denies (or fails), the groups already
//     accepted are given back (give_back.lua): each check that
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

// slotGroups are the indexes of checks by hash slot, in the order their
// slots first appear.
func slotGroups(checks []check) [][]int {
	var groups [][]int
	at := map[uint16]int{}
	for i := range checks {
		s := keyslot.Of(checks[i].key)
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

// steps decides dec, a take whose keys are in several slots, a slot at a
// time, each step under a deadline of its own.
func (d *Dispatcher) steps(dec *Decision, client rueidis.Client) {
	groups := slotGroups(dec.checks)
	var accepted [][]int
	for gi, g := range groups {
		ok, err := d.step(dec, client, g)
		if err != nil {
			d.giveBack(client, dec, accepted)
			d.end(dec, err)
			return
		}
		if !ok {
			for _, later := range groups[gi+1:] {
				for _, i := range later {
					dec.out(i).skip()
				}
			}
			d.giveBack(client, dec, accepted)
			break
		}
		accepted = append(accepted, g)
	}
	d.conclude(dec)
}

// step takes the checks g of dec, whose keys share a slot, as one script
// on their node, and reports whether every enforced one accepted.
func (d *Dispatcher) step(dec *Decision, client rueidis.Client, g []int) (bool, error) {
	key := dec.checks[g[0]].key
	if err := d.store.Admit(key); err != nil {
		return false, err
	}
	call, err := luascript.TakeChecksCall(dec.takes(g), dec.req.RequestID, dec.digest)
	if err != nil {
		return false, err
	}
	ctx, cancel := d.depart(dec, time.Now())
	defer cancel()
	span := d.callSpan(callStep, dec)
	res := call.Exec(ctx, client)
	d.callEnded(span, res)
	ok, err := d.read(dec, g, res)
	d.observe(key, err, &dec.trip)
	return ok, err
}

// giveBack gives back what the accepted groups' checks consumed in this
// take: those that accepted and did not replay. One that cannot be given
// back keeps its cost until its limits free it (see above), and is logged.
func (d *Dispatcher) giveBack(client rueidis.Client, dec *Decision, groups [][]int) {
	for _, g := range groups {
		var idx []int
		for _, i := range g {
			if o := dec.out(i); o.Allowed && !o.Replay {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			continue
		}
		call, err := luascript.GiveBackCall(dec.takes(idx), dec.req.RequestID, dec.digest)
		var given []bool
		if err == nil {
			// A give back is the take's cleanup: it gets a whole
			// --redis-timeout, whatever the take's own deadline.
			at, _ := d.deadline(nil, time.Now())
			ctx, cancel := context.WithDeadline(d.opts.Context, at)
			span := d.callSpan(callGiveBack, dec)
			res := call.Exec(ctx, client)
			d.callEnded(span, res)
			given, err = luascript.ParseGiveBack(res, len(idx))
			cancel()
		}
		for j, i := range idx {
			if err != nil || !given[j] {
				d.log.Warn("could not give back a check of a denied take: it holds its cost until its limits free it",
					append([]zap.Field{zap.String(keyKey, dec.checks[i].key), zap.String(keyRequestID, dec.req.RequestID), zap.Error(err)},
						dec.traceLog()...)...)
			}
		}
	}
}
