package dispatch

import (
	"sync"
	"time"

	"quotad/luascript"
)

// batcher sends the decisions of every connection to Redis in shared
// batches: one ExecBatch carries every call that came while the earlier
// batches were at Redis, as one script call per Redis node (per hash slot
// on a Cluster) that decides each in turn, each as atomically as alone.
// Usually batchRunners batches are at Redis at once; a decision that comes
// while they are joins the next one, which goes as soon as a runner is
// free. Under load batches grow with the load; alone, a decision goes at
// once.
//
// Queueing is bounded: a decision that has waited patience (a quarter of
// --redis-timeout, route.go) for a runner goes in a batch of its own even though
// batchRunners batches are at Redis, up to maxBatchesInFlight. A slow
// round trip (latency on the link) holds the runners without keeping
// Redis busy, and waiting for one of them to come back would spend the
// decisions' deadline inside quotad: with the bound, a decision has at
// least three quarters of its deadline at Redis whatever the latency, and
// only then does its running out count against Redis's health (fair).
//
// A decision is never answered later than --redis-timeout after Run: a
// batch's deadline is its oldest decision's, and a batch whose decisions
// waited out their deadline (every runner busy past it), or waited while
// Redis went down, is answered as not run without being sent.
type batcher struct {
	d       *Dispatcher
	mu      sync.Mutex
	cond    sync.Cond
	pending []*Decision
	closed  bool
	// busy counts the batches at Redis now.
	busy int
	// wake wakes the runners when the oldest decision will have waited
	// patience; armed says it is set.
	wake  *time.Timer
	armed bool
	wg    sync.WaitGroup
}

// batchRunners is how many batches are at Redis at once while decisions
// wait less than patience. One leaves Redis idle while a batch's replies
// travel back and the next batch travels there; two keep it busy. More
// measured the same as two.
const batchRunners = 2

// maxBatchesInFlight bounds the batches at Redis at once when decisions
// have waited patience: each holds a runner, a goroutine waiting for its
// reply.
const maxBatchesInFlight = 8

// maxBatch bounds the decisions of one batch, so that one batch holds
// Redis (and the replies of its first decisions) only briefly: at most one
// batch script call (luascript.MaxBatch).
const maxBatch = luascript.MaxBatch

func (b *batcher) start(d *Dispatcher) {
	b.d = d
	b.cond.L = &b.mu
	b.wake = time.AfterFunc(time.Hour, func() {
		b.mu.Lock()
		b.armed = false
		b.mu.Unlock()
		b.cond.Broadcast()
	})
	b.wake.Stop()
	for range maxBatchesInFlight {
		b.wg.Add(1)
		go b.run()
	}
}

func (b *batcher) submit(dec *Decision) {
	b.mu.Lock()
	if b.closed {
		// The server has stopped: nothing is sent any more.
		b.mu.Unlock()
		b.answer([]*Decision{dec}, errClosed)
		return
	}
	b.pending = append(b.pending, dec)
	// A runner is woken only when one may take it: while batchRunners
	// batches are at Redis, a runner that comes back takes it, or the
	// wake-up at patience wakes them. Waking one to find it may not go
	// would cost a switch of goroutines per decision under load.
	wake := b.mayGoLocked()
	b.mu.Unlock()
	if wake {
		b.cond.Signal()
	}
}

// close ends the runners once every submitted decision is answered.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
	b.wg.Wait()
	b.wake.Stop()
}

func (b *batcher) run() {
	defer b.wg.Done()
	var batch []*Decision
	var calls []luascript.Call
	for {
		b.mu.Lock()
		for !b.mayGoLocked() {
			if b.closed && len(b.pending) == 0 {
				b.mu.Unlock()
				return
			}
			b.cond.Wait()
		}
		n := min(len(b.pending), maxBatch)
		batch = append(batch[:0], b.pending[:n]...)
		rest := copy(b.pending, b.pending[n:])
		clear(b.pending[rest:])
		b.pending = b.pending[:rest]
		b.busy++
		b.mu.Unlock()
		calls = b.send(batch, calls[:0])
		clear(batch)
		clear(calls)
		b.mu.Lock()
		b.busy--
		// This runner takes the next batch itself; another is woken only
		// for what is left past it.
		more := len(b.pending) > maxBatch
		b.mu.Unlock()
		if more {
			b.cond.Signal()
		}
	}
}

// mayGoLocked reports whether a runner may take a batch now: decisions
// wait, and fewer than batchRunners batches are at Redis, or the oldest
// decision has waited patience and fewer than maxBatchesInFlight are, or
// the batcher is closing. Otherwise, while decisions wait, it arms the
// wake-up for when the oldest will have waited patience. An armed wake-up
// is for the oldest decision or one older (pending is in order), so it
// comes no later than the oldest's patience: it is not read again.
func (b *batcher) mayGoLocked() bool {
	switch {
	case len(b.pending) == 0:
		return false
	case b.busy < batchRunners || b.closed:
		return true
	case b.busy >= maxBatchesInFlight || b.armed:
		return false
	}
	wait := b.d.patience() - time.Since(b.pending[0].queued)
	if wait <= 0 {
		return true
	}
	b.armed = true
	b.wake.Reset(wait)
	return false
}

// send answers a batch's decisions, and returns calls for reuse.
func (b *batcher) send(batch []*Decision, calls []luascript.Call) []luascript.Call {
	d := b.d
	client, err := d.store.Client()
	if err != nil {
		// Redis went down while they waited: as Run would have answered.
		b.answer(batch, err)
		return calls
	}
	if batch = b.keepSendable(batch); len(batch) == 0 {
		return calls
	}
	// The batch's deadline is its oldest decision's: none of them is
	// answered later than its own.
	ctx, cancel := d.depart(batch[0], batch[0].queued)
	defer cancel()
	if t := batch[0].trip; !t.sent.Before(t.deadline) {
		// Their time ran out behind earlier batches: not sent, not run.
		b.answer(batch, ErrWaitedTooLong)
		return calls
	}
	for _, dec := range batch {
		dec.trip = batch[0].trip
		calls = append(calls, dec.call)
	}
	d.metrics.queued(batch...)
	d.metrics.batchSize.Observe(float64(len(batch)))
	client = d.client(client)
	span := d.callSpan(callBatch, batch...)
	if len(calls) == 1 {
		res := calls[0].Exec(ctx, client)
		d.callEnded(span, res)
		d.complete(batch[0], res)
		return calls
	}
	res := luascript.ExecBatch(ctx, client, calls)
	d.callEnded(span, res...)
	for i, dec := range batch {
		d.complete(dec, res[i])
	}
	return calls
}

// keepSendable answers at once, unsent, the decisions of batch whose Redis
// node went down while they waited (a Cluster's other nodes may be up),
// and returns the others, in order, in batch's own array.
func (b *batcher) keepSendable(batch []*Decision) []*Decision {
	kept := batch[:0]
	for _, dec := range batch {
		if err := b.d.store.Admit(dec.key()); err != nil {
			b.answer([]*Decision{dec}, err)
			continue
		}
		kept = append(kept, dec)
	}
	clear(batch[len(kept):])
	return kept
}

// answer answers a batch, unsent, as Redis's failure err says.
func (b *batcher) answer(batch []*Decision, err error) {
	for _, dec := range batch {
		b.d.end(dec, err)
	}
}
