package sidecar

import (
	"context"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"quotad/luascript"
	"quotad/protocol"
)

// maxBatch bounds the requests of one batch; the queue's free room bounds
// it too (see conn.readBatch).
const maxBatch = 64

// windowBatch gathers the fixed-window takes and peeks of the lines one
// connection had buffered at once, to send them to Redis with one
// ExecMulti: rueidis then writes them in one go instead of flushing as each
// worker's call trickles in (the write(2) of its pipe was a quarter of the
// CPU of the pipelined socket path). The reader stages it and a worker runs
// it, so the reader goes on reading meanwhile, as for single requests.
type windowBatch struct {
	client rueidis.Client
	items  []batchItem
	calls  []luascript.Call
	res    []rueidis.RedisResult
}

var batches = sync.Pool{New: func() any { return new(windowBatch) }}

type batchItem struct {
	sl    *slot
	w     windowCall
	start time.Time // for observeRequest
}

// batchable resolves a request's limits and reports whether a batch can
// carry it: a fixed-window take or peek with the server's own Redis
// timeout, so that the batch's one call context is the one decide would
// use. Anything else, including a request resolve refuses, goes the single
// path.
func (s *Server) batchable(req *protocol.Request) (limits, bool) {
	if req.Op != protocol.OpTake && req.Op != protocol.OpPeek || s.timeout(req) != s.opts.RedisTimeout {
		return limits{}, false
	}
	l, err := s.resolve(req)
	return l, err == nil && l.algorithm == ""
}

// stage begins a batchable request as decide would: it answers it at once
// into sl.out (staged false: the store has no client, the window is known
// to be exhausted, or the call fails validation) or adds its call to b, for
// runBatch to answer.
func (s *Server) stage(b *windowBatch, sl *slot, l limits) (staged bool) {
	req := &sl.req
	start := s.beginRequest()
	dst := sl.out[:0]
	out := dst
	defer func() {
		if !staged {
			s.observeRequest(req, start, len(dst), &out)
			sl.out = out
		}
	}()
	w, out, ok := s.prepareWindow(req, l, dst)
	if !ok {
		return false // known to be exhausted, whatever Redis's state
	}
	client, err := s.store.Client()
	if err == nil {
		err = s.store.Check(w.key)
	}
	if err != nil {
		out = s.appendUndecided(dst, req, l, err)
		return false
	}
	if w.err != nil {
		out = s.finishWindow(&w, rueidis.RedisResult{}, false, dst)
		return false
	}
	b.client = s.instrument(client)
	b.items = append(b.items, batchItem{sl: sl, w: w, start: start})
	b.calls = append(b.calls, w.call)
	return true
}

// runBatch sends the staged calls, one ExecMulti for more than one, and
// writes each request's reply into its slot's out, in order; the caller
// then marks the slots done and resets b.
func (s *Server) runBatch(b *windowBatch) {
	if len(b.items) == 0 {
		return
	}
	ctx, cancel := s.callContext(s.reqCtx, s.opts.RedisTimeout)
	s.sendBatch(ctx, b, false)
	cancel()
}

// sendBatch is runBatch with the call's context; shortened says its
// deadline is nearer than --redis-timeout, so that running out of it says
// nothing about Redis's health.
func (s *Server) sendBatch(ctx context.Context, b *windowBatch, shortened bool) {
	if len(b.calls) == 1 {
		b.res = append(b.res[:0], b.calls[0].Exec(ctx, b.client))
	} else {
		b.res = luascript.ExecMulti(ctx, b.client, b.calls)
	}
	s.batched.Add(int64(len(b.items)))
	s.metrics.redisBatch.Observe(float64(len(b.items)))
	for i := range b.items {
		it := &b.items[i]
		out := s.finishWindow(&it.w, b.res[i], shortened, it.sl.out[:0])
		s.observeRequest(&it.sl.req, it.start, 0, &out)
		it.sl.out = out
	}
}

// reset empties b for the next read, dropping its references to slots
// (which go back to their pool) and to requests' strings.
func (b *windowBatch) reset() {
	clear(b.items)
	clear(b.calls)
	clear(b.res)
	b.items, b.calls, b.res, b.client = b.items[:0], b.calls[:0], b.res[:0], nil
}
