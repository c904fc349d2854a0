package store

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is returned by Store.Client while Redis is down: calls fail
// at once instead of each waiting out --redis-timeout, and only the
// background probe talks to Redis until it answers again.
var ErrBreakerOpen = errors.New("redis is down (breaker open): the request was not run")

// Flap damping of the breaker. A breaker that opens again soon after a probe
// closed it (Redis answers PING but not the scripts, or comes and goes)
// needs twice as many successful probes in a row to close the next time, up
// to maxCloseProbes. Each close lets through only the requests of one
// --redis-timeout before a failure opens it again, so a flapping Redis sees
// one such burst per closeProbes probe intervals, and none of the requests
// answered while it was open are queued to be released at the close.
const (
	// flapProbes: a breaker reopened within this many probe intervals of
	// closing counts as flapping.
	flapProbes = 10
	// maxCloseProbes bounds the probes in a row a flapping breaker needs.
	maxCloseProbes = 16
)

// breaker is the health of one Redis: the whole of a single server or a
// Sentinel's master, or one node of a Cluster (cluster.go). Its state is
// healthUnknown until the first answer or failure, then up or down; while it
// is down, calls fail fast, and only the background probe closes it again.
type breaker struct {
	health atomic.Int32
	damper damper // when the breaker may close again
	// lastErr is why Redis was last found down, for ping and for replies
	// while there is no connection; nil while Redis is up.
	lastErr atomic.Pointer[error]
}

// set moves the health to up or down and reports whether it changed, and
// how many successful probes in a row close the breaker now. Only the probe
// closes an open breaker: a call that started before it opened and was
// answered late does not, so that the damping of a flapping Redis holds.
// Likewise a call sent before the probe last closed it (sent, zero when
// unknown), which failed late, does not open it again: it says how Redis
// was before the close, and counting it as a flap would hold the breaker
// open for probes more after Redis came back.
func (b *breaker) set(up, probe bool, sent time.Time, err error) (changed bool, need int) {
	next := healthDown
	if up {
		next = healthUp
	} else {
		if !probe && b.damper.closedAfter(sent) {
			return false, 0
		}
		b.noteErr(false, err)
	}
	// Every call reports here: read first, so the steady state costs no
	// write to a cache line all request goroutines share.
	if b.health.Load() == next {
		return false, 0
	}
	// The damper's lock makes opening and its bookkeeping one step, so a
	// probe never counts toward closing a breaker whose damping is not set,
	// and a late answer never closes a breaker that opened meanwhile.
	b.damper.mu.Lock()
	if up && !probe && b.health.Load() == healthDown || !up && !probe && b.damper.closedAfterLocked(sent) {
		b.damper.mu.Unlock()
		return false, 0
	}
	prev := b.health.Swap(next)
	if prev != next && !up {
		b.damper.openedLocked(time.Now(), prev == healthUp)
	}
	need = max(b.damper.need, 1)
	b.damper.mu.Unlock()
	if prev == next {
		return false, 0
	}
	if up {
		b.noteErr(true, nil)
	}
	return true, need
}

// probed feeds a probe's outcome to the breaker: a failure opens it (or
// keeps it open); while it is open, a success closes it once the damper
// has seen enough successes in a row. It reports what set does.
func (b *breaker) probed(err error) (changed bool, need int) {
	if err != nil && !isRedisReply(err) {
		b.damper.probeFailed()
		return b.set(false, true, time.Time{}, err)
	}
	if b.health.Load() == healthDown && !b.damper.probeOK(time.Now()) {
		return false, 0
	}
	return b.set(true, true, time.Time{}, nil)
}

// noteErr remembers why Redis is down, or forgets it once Redis is up. The
// steady state costs one atomic read.
func (b *breaker) noteErr(up bool, err error) {
	if up {
		if b.lastErr.Load() != nil {
			b.lastErr.Store(nil)
		}
		return
	}
	if err != nil {
		err = describeRedisErr(err)
		b.lastErr.Store(&err)
	}
}

// lastError is why Redis was last found down, or nil while it is up.
func (b *breaker) lastError() error {
	if p := b.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// damper is the breaker's memory between transitions. Its methods run on
// the rare transitions and on probes, never on a healthy request's path.
type damper struct {
	mu       sync.Mutex
	every    time.Duration // the probe interval
	closedAt time.Time     // when a probe last closed the breaker
	need     int           // successful probes in a row that close it
	oks      int           // successful probes in a row so far
}

// opened records that the breaker opened at now; closedBefore says whether it
// had been closed (Redis was up), as opposed to never known.
func (d *damper) opened(now time.Time, closedBefore bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.openedLocked(now, closedBefore)
}

func (d *damper) openedLocked(now time.Time, closedBefore bool) {
	d.oks = 0
	if closedBefore && !d.closedAt.IsZero() && now.Sub(d.closedAt) < flapProbes*d.every {
		d.need = min(max(d.need, 1)*2, maxCloseProbes)
		return
	}
	d.need = 1
}

// closedAfter reports whether a probe closed the breaker after sent (zero:
// unknown, never).
func (d *damper) closedAfter(sent time.Time) bool {
	if sent.IsZero() {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closedAfterLocked(sent)
}

func (d *damper) closedAfterLocked(sent time.Time) bool {
	return !sent.IsZero() && sent.Before(d.closedAt)
}

// probeFailed restarts the count of successful probes.
func (d *damper) probeFailed() {
	d.mu.Lock()
	d.oks = 0
	d.mu.Unlock()
}

// probeOK counts a successful probe while the breaker is open and reports
// whether it closes the breaker.
func (d *damper) probeOK(now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.oks++
	if d.oks < max(d.need, 1) {
		return false
	}
	d.oks = 0
	d.closedAt = now
	return true
}

// closeProbes is how many successful probes in a row close the breaker now.
func (d *damper) closeProbes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(d.need, 1)
}
