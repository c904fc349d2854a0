package sidecar

import (
	"context"
	"errors"
	"sync"
	"time"
)

// groupBatcher sends the fixed-window takes and peeks of one-at-a-time
// clients to Redis in shared batches. Such a request is run by its
// connection's reader (conn.readLoop: nothing else of the connection is in
// flight), and each used to be one Redis call of its own: with 16 clients
// rueidis wrote about 1.5 decisions per write(2) to Redis, and each write,
// Redis's read and its reply cost the sidecar and Redis more than the
// script did. Here at most groupInFlight batches are at Redis at once; a
// request that comes while they are joins the next batch, which goes as
// soon as one of them is answered. Under load batches grow with the load;
// alone, a request goes at once.
//
// A request never waits longer than --redis-timeout from its arrival: the
// batch's deadline is its oldest request's, and a batch whose requests
// waited while Redis went down is answered as the breaker says (not run)
// without being sent.
type groupBatcher struct {
	s       *Server
	mu      sync.Mutex
	pending *windowBatch // the next batch, nil when empty
	running int          // batches at Redis or being answered
}

// groupInFlight is how many batches may be at Redis at once. One leaves
// Redis idle while a batch's replies travel back and the next batch
// travels there; two keep it busy. More measured the same as two.
const groupInFlight = 2

// run answers sl, a fixed-window take or peek with limits l, and returns
// once its reply is in sl.out.
func (g *groupBatcher) run(sl *slot, l limits) {
	if sl.ready == nil {
		sl.ready = make(chan struct{}, 1)
	}
	g.mu.Lock()
	b := g.pending
	if b == nil {
		b = batches.Get().(*windowBatch)
		g.pending = b
	}
	if !g.s.stage(b, sl, l) {
		if len(b.items) == 0 {
			g.pending = nil
			batches.Put(b)
		}
		g.mu.Unlock()
		return // answered without Redis
	}
	start := g.running < groupInFlight
	if start {
		g.running++
		g.pending = nil
	}
	g.mu.Unlock()
	if start {
		g.s.workers.run(job{g: g, b: b})
	}
	<-sl.ready
}

// loop answers b, and then the batches that gathered meanwhile, on a
// worker.
func (g *groupBatcher) loop(b *windowBatch) {
	for b != nil {
		g.send(b)
		for i := range b.items {
			b.items[i].sl.ready <- struct{}{}
		}
		b.reset()
		batches.Put(b)
		g.mu.Lock()
		b = g.pending
		if b != nil {
			g.pending = nil
		} else {
			g.running--
		}
		g.mu.Unlock()
	}
}

// send answers b's requests into their slots.
func (g *groupBatcher) send(b *windowBatch) {
	s := g.s
	client, err := s.store.Client()
	if err != nil {
		g.answer(b, err) // Redis went down while they waited: as stage would have answered
		return
	}
	if !g.keepSendable(b) {
		return
	}
	b.client = s.instrument(client)
	// Requests that waited less than the shared deadline's tolerance take
	// a shared context (deadline.go); others keep their own deadline.
	oldest := b.items[0].start
	waited := time.Since(oldest)
	if waited < s.deadlines.share {
		ctx, cancel := s.callContext(s.reqCtx, s.opts.RedisTimeout)
		s.sendBatch(ctx, b, false)
		cancel()
		return
	}
	if waited >= s.opts.RedisTimeout {
		// Their time ran out behind earlier batches: not sent, not run.
		g.answer(b, errWaitedTooLong)
		return
	}
	ctx, cancel := context.WithDeadline(s.reqCtx, oldest.Add(s.opts.RedisTimeout))
	// A call left with less than half the deadline says little about
	// Redis when it runs out; one with more does, as for any call.
	s.sendBatch(ctx, b, waited > s.opts.RedisTimeout/2)
	cancel()
}

// keepSendable answers at once, unsent, the requests of b whose Redis node
// went down while they waited (a Cluster's other nodes may be up), and
// drops them from b. It reports whether any request is left to send.
func (g *groupBatcher) keepSendable(b *windowBatch) bool {
	s := g.s
	items, calls := b.items[:0], b.calls[:0]
	for i := range b.items {
		it, call := b.items[i], b.calls[i]
		if err := s.store.Check(it.w.key); err != nil {
			out := s.appendUndecided(it.sl.out[:0], &it.sl.req, it.w.l, err)
			s.observeRequest(&it.sl.req, it.start, 0, &out)
			it.sl.out = out
			it.sl.ready <- struct{}{}
			continue
		}
		items, calls = append(items, it), append(calls, call)
	}
	clear(b.items[len(items):])
	clear(b.calls[len(calls):])
	b.items, b.calls = items, calls
	return len(items) > 0
}

// errWaitedTooLong answers requests whose deadline passed while they
// waited for a batch (appendFailure: UNAVAILABLE, not run).
var errWaitedTooLong = errors.New("redis did not answer earlier calls within the deadline")

// answer answers b's requests, unsent, as Redis's failure err says.
func (g *groupBatcher) answer(b *windowBatch, err error) {
	s := g.s
	for i := range b.items {
		it := &b.items[i]
		out := s.appendUndecided(it.sl.out[:0], &it.sl.req, it.w.l, err)
		s.observeRequest(&it.sl.req, it.start, 0, &out)
		it.sl.out = out
	}
}
