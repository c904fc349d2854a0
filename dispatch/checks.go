package dispatch

import (
	"errors"
	"strconv"

	"quotad/keyslot"
	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// A take of several limits ("checks", protocol/checks.go) is one
// Decision of several checks, and a take of one limit a Decision of one:
// each check resolves, builds its take's call and reads its reply through
// its Algorithm, and the rules below are written once, over the checks.
// Only the route differs: several checks go to Redis as one script
// (luascript.TakeChecksCall) that takes every check or none, or in steps
// on a Redis Cluster (steps.go).
//
//   - The verdict (verdict): the take is allowed when every check that is
//     not in shadow mode accepts; then every check that accepts consumes.
//     When one denies, none consumes. Its retry_after_ms is the largest of
//     the denying checks'.
//   - Shadow mode is per check: a check of a shadow policy never denies
//     the take; its own verdict is its shadow_allowed, and it consumes
//     when it accepts and the take is allowed.
//   - The local denial (localDenied): a take without request_id one of
//     whose checks (not a shadow one) is known to deny is denied without
//     Redis; the checks not asked are "skipped". A take whose checks are
//     all known to deny, each of a shadow policy, is answered without
//     Redis too: it would write nothing. Every check's answer from Redis
//     feeds the local denial of its key.
//   - on_unavailable (undecided): a take Redis did not decide is
//     UNAVAILABLE unless every check's policy says allow or deny. Then it
//     is degraded, and denied when a check that is not a shadow one says
//     deny.
//   - Metrics count the take once in quotad_requests_total and each check
//     in quotad_decisions_total, under its policy and algorithm; a check
//     that accepted in a take another check denied counts as unapplied,
//     a skipped one as skipped. The decision log writes a line per check.
//   - Headers: every check is a member of RateLimit-Policy and RateLimit,
//     in order (a skipped one of RateLimit-Policy only).
//
// Replays: the take's request_id is each check's; a retry replays every
// check; a retry with another set of checks or costs is CONFLICT, since
// each check's record keeps the digest of the set (digestPart).

// Results of a check of a take of several checks, beside those of
// Outcome.Result.
const (
	// ResultUnapplied: the check accepted, but another check denied the
	// take, so nothing was consumed.
	ResultUnapplied = "unapplied"
	// ResultSkipped: the take was denied locally by another check before
	// this one was asked.
	ResultSkipped = "skipped"
)

// takeOfChecks builds the one script call that takes every check of dec,
// a request with "checks", and notes whether their keys are in several
// hash slots.
func (d *Dispatcher) takeOfChecks(dec *Decision) (luascript.Call, error) {
	n := len(dec.checks)
	parts := make([]string, n)
	slot := -1
	for i := range dec.checks {
		c := &dec.checks[i]
		parts[i] = digestPart(c.limit.Algorithm.Name(), c.key, c.req.Cost)
		if s := int(keyslot.Of(c.key)); slot >= 0 && s != slot {
			dec.crossSlot = true
		} else {
			slot = s
		}
	}
	if dec.req.RequestID != "" {
		dec.digest = luascript.ChecksDigest(parts)
	}
	return luascript.TakeChecksCall(dec.takes(allChecks[:n]), dec.req.RequestID, dec.digest)
}

// takes are the take calls of dec's checks idx, for a script that takes
// them together.
func (dec *Decision) takes(idx []int) []luascript.TakeCheck {
	out := make([]luascript.TakeCheck, len(idx))
	for j, i := range idx {
		c := &dec.checks[i]
		out[j] = luascript.TakeCheck{Call: c.call, Shadow: c.limit.Shadow}
	}
	return out
}

// digestPart is what the digest of a take's set of checks says of one
// check: its algorithm, key and cost. Its limits are left out, so that a
// retry after a policy's limits changed is still the same take.
func digestPart(algorithm, key string, cost int64) string {
	return algorithm + " " + strconv.FormatInt(cost, 10) + " " + key
}

// checkErr names check i (from 0) in err's message, for a request with
// "checks"; a lone check's error is the request's own.
func (dec *Decision) checkErr(i int, err error) error {
	if !dec.listed() {
		return err
	}
	name := "check " + strconv.Itoa(i+1) + ": "
	if pe, ok := errors.AsType[*protocol.Error](err); ok {
		return &protocol.Error{Code: pe.Code, Message: name + pe.Message}
	}
	if le, ok := errors.AsType[*luascript.Error](err); ok {
		return &luascript.Error{Code: le.Code, Message: name + le.Message, Healed: le.Healed}
	}
	return err
}

// verdict writes a take's verdict over its checks' answers, after shadow
// mode: allowed when every check allows. A denied take consumed nothing,
// so its checks that accepted report the state as it is (unapplied), and
// it may be retried after the longest retry_after_ms of the checks that
// deny. A take of one check is that check's answer.
func (dec *Decision) verdict() {
	o := &dec.Out
	allowed, replay, retry := true, true, int64(0)
	for i := range dec.checks {
		oc := dec.out(i)
		if !oc.Allowed {
			allowed, retry = false, max(retry, oc.RetryAfterMS)
		}
		replay = replay && oc.Replay
	}
	if !allowed {
		for i := range dec.checks {
			if oc := dec.out(i); !oc.Skipped {
				unapplied(oc, dec.checks[i].req.Cost)
			}
		}
		o.RetryAfterMS = retry
	}
	o.Allowed, o.Replay = allowed, allowed && replay
}

// unapplied makes the outcome of a check that accepted in a take that was
// denied say what was consumed: nothing. Its used and remaining are as
// they are (the script answered them as after consuming); its reset_ms is
// what it would have been.
func unapplied(o *Outcome, cost int64) {
	if !o.accepted() || o.Replay {
		return
	}
	if o.Algorithm == limits.Concurrency {
		cost, o.LeaseMS = 1, 0
	}
	o.Used, o.Remaining = max(o.Used-cost, 0), min(o.Remaining+cost, o.Limit)
}

// skip makes o the outcome of a check that was not asked: its state is
// unknown, and it denies nothing.
func (o *Outcome) skip() {
	*o = o.fresh()
	o.Allowed, o.Skipped, o.Remaining = true, true, o.Limit
}

// localDenied answers dec, a take without request_id, from the local
// denial when it can: when a check that is not a shadow one is known to
// deny (the others are not asked), or when every check is known to deny.
func (d *Dispatcher) localDenied(dec *Decision) bool {
	known := 0
	for i := range dec.checks {
		if !d.deny.answer(dec, i, dec.queued) {
			continue
		}
		if !dec.checks[i].limit.Shadow {
			for j := range dec.checks {
				if j != i {
					dec.out(j).skip()
				}
			}
			dec.verdict()
			return true
		}
		known++
	}
	if known < len(dec.checks) {
		// Redis decides: the shadow checks answered here are asked again.
		for i := range dec.checks {
			if o := dec.out(i); o.Local {
				*o = o.fresh()
			}
		}
		return false
	}
	// Every check denies, and each is a shadow one: Redis would write
	// nothing, and the take is allowed.
	for i := range dec.checks {
		dec.out(i).applyShadow(true)
	}
	dec.verdict()
	return true
}
