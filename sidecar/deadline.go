package sidecar

import (
	"context"
	"sync/atomic"
	"time"
)

// sharedDeadline hands out Redis call contexts that requests started close
// together share, instead of a context and a timer per request (6% of the
// CPU of the pipelined socket path in the profile of
// BenchmarkSocketPipelined). A context made at t with deadline t+timeout
// serves the requests that start until t+share, so a call's deadline is
// between timeout-share and timeout away, never later. share is a
// thousandth of the timeout (1ms for the default 1s), so at most about a
// thousand contexts and timers are alive whatever the timeout.
type sharedDeadline struct {
	parent  context.Context
	timeout time.Duration
	share   time.Duration
	cur     atomic.Pointer[deadlineCtx]
}

type deadlineCtx struct {
	ctx  context.Context
	made time.Time
	// cancel is never called early: other requests share ctx. Its timer
	// releases it at the deadline, and cancelling parent releases it too.
	cancel context.CancelFunc
}

func newSharedDeadline(parent context.Context, timeout time.Duration) *sharedDeadline {
	return &sharedDeadline{parent: parent, timeout: timeout, share: max(timeout/1000, time.Microsecond)}
}

func (d *sharedDeadline) get(now time.Time) context.Context {
	if c := d.cur.Load(); c != nil && now.Sub(c.made) < d.share {
		return c.ctx
	}
	ctx, cancel := context.WithDeadline(d.parent, now.Add(d.timeout))
	d.cur.Store(&deadlineCtx{ctx: ctx, made: now, cancel: cancel})
	return ctx
}

// callContext bounds one Redis call by timeout. Calls of requests from the
// connections (parent is the server's request context) with the server's
// own timeout share their context; others get their own.
func (s *Server) callContext(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if parent == s.reqCtx && timeout == s.opts.RedisTimeout && s.deadlines != nil {
		return s.deadlines.get(time.Now()), func() {}
	}
	return context.WithTimeout(parent, timeout)
}
