package store

import (
	"errors"
	"sync"
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
