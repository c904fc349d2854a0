package dispatch

import (
	"context"
	"time"

	"github.com/redis/rueidis"

	"quotad/protocol"
	"quotad/store"
)

// A decision's script call goes to Redis by one of these routes, chosen
// in one place (route), each under the deadline that deadline gives:
type route int8

const (
	// routeBatch: in the next shared batch (batcher.go), under the
	// deadline of the batch's oldest decision.
	routeBatch route = iota
	// routeAlone: by itself, under the request's own timeout_ms, which is
	// shorter than --redis-timeout and would shorten a batch's deadline.
	routeAlone
	// routeOneNode: a take whose checks are in several hash slots, whole
	// to the embedded store's one node, which holds every slot.
	routeOneNode
	// routeSteps: a take whose checks are in several hash slots of a Redis
	// Cluster, a slot at a time (steps.go).
	routeSteps
)

// send sends dec's call to Redis by its route, or ends it when it cannot
// be sent: the store is not connected, or the breaker of the Redis that
// serves its key (on a Cluster, of the node) is open.
func (d *Dispatcher) send(dec *Decision) {
	r, err := d.route(dec)
	if err != nil {
		d.end(dec, err)
		return
	}
	if r == routeBatch {
		d.batch.submit(dec)
		return
	}
	go d.alone(dec, r)
}

// route chooses how dec's call goes to Redis, or says why it cannot go.
func (d *Dispatcher) route(dec *Decision) (route, error) {
	client, err := d.store.Client()
	if err != nil {
		return 0, err
	}
	r := routeBatch
	if _, own := d.deadline(dec.req, dec.queued); own {
		r = routeAlone
	}
	// A routing client (a Cluster's, or the embedded store's) cannot send
	// one script on keys of several slots.
	if dec.crossSlot && client.Mode() == rueidis.ClientModeCluster {
		switch {
		case d.store.Kind() == store.StoreEmbedded:
			r = routeOneNode
		case dec.req.RequestID == "":
			return 0, errStepsNeedID
		default:
			r = routeSteps
		}
	}
	return r, d.store.Admit(dec.key())
}

// deadline is when a call that began waiting at from must be answered:
// --redis-timeout after from, or sooner when req (nil for none) asks for
// a shorter timeout_ms; own reports the latter.
func (d *Dispatcher) deadline(req *protocol.Request, from time.Time) (at time.Time, own bool) {
	if req != nil {
		if t := time.Duration(req.TimeoutMS) * time.Millisecond; t > 0 && t < d.opts.RedisTimeout {
			return from.Add(t), true
		}
	}
	return from.Add(d.opts.RedisTimeout), false
}

// patience is how long a decision waits inside quotad for a batch to go
// while batchRunners batches are at Redis (batcher.go): a quarter of
// --redis-timeout, so that a call sent within it has three quarters of its
// deadline at Redis, enough for its running out to count against Redis's
// health (fair).
func (d *Dispatcher) patience() time.Duration { return d.opts.RedisTimeout / 4 }

// trip is the timing of one script call, from which its failure is
// judged (classify): a call that had little of its deadline at Redis says
// little of Redis's health when it runs out.
type trip struct {
	// queued is when the call's oldest decision began waiting (Run): its
	// deadline counts from here.
	queued time.Time
	// sent is when the call left for Redis; sent - queued is the time it
	// waited inside quotad.
	sent     time.Time
	deadline time.Time
	// own: the deadline is a request's shorter timeout_ms.
	own bool
}

// clockStart anchors monoNow.
var clockStart = time.Now()

// monoNow is time.Now read from the monotonic clock alone: one clock read,
// not two (the wall clock and the monotonic one), which on a virtual
// machine can cost a hundred nanoseconds or more each, and a decision
// reads the clock several times. Durations and comparisons between times
// use the monotonic reading, as they do for time.Now's; its wall time is
// the start's plus the monotonic time since, which misses a step of the
// wall clock since, so it is not for showing (a span's start).
func monoNow() time.Time { return clockStart.Add(time.Since(clockStart)) }

// depart starts a call of dec that began waiting at from: dec.trip is its
// timing, and the context carries its deadline.
func (d *Dispatcher) depart(dec *Decision, from time.Time) (context.Context, context.CancelFunc) {
	at, own := d.deadline(dec.req, from)
	dec.trip = trip{queued: from, sent: monoNow(), deadline: at, own: own}
	return context.WithDeadline(d.opts.Context, at)
}

// alone sends dec's call by itself, by route r (not routeBatch): under
// its own deadline, from when it began waiting, or in steps.
func (d *Dispatcher) alone(dec *Decision, r route) {
	client, err := d.store.Client()
	if err != nil {
		// Redis went down since Run: as Run would have answered.
		d.end(dec, err)
		return
	}
	client = d.client(client)
	if r == routeSteps {
		dec.trip.sent = monoNow()
		d.metrics.queued(dec)
		d.steps(dec, client)
		return
	}
	ctx, cancel := d.depart(dec, dec.queued)
	defer cancel()
	d.metrics.queued(dec)
	span := d.callSpan(callAlone, dec)
	var res rueidis.RedisResult
	if r == routeOneNode {
		res = dec.call.ExecOnOneNode(ctx, client)
	} else {
		res = dec.call.Exec(ctx, client)
	}
	d.callEnded(span, res)
	d.complete(dec, res)
}
