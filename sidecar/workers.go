package sidecar

import (
	"sync"
	"time"
)

// workers runs requests on goroutines that outlive one request. A fresh
// goroutine per request grew its stack on every call into rueidis: copying
// stacks was a fifth of the sidecar's CPU under pipelining load. A parked
// worker keeps its grown stack, so a request costs one channel send.
//
// Idle workers are kept most recently used first, at most maxIdle of them;
// one idle for longer than workerIdleTimeout exits when the next request
// comes by, so a burst does not pin memory. close ends the idle ones, and
// busy ones exit when they finish.
type workers struct {
	mu      sync.Mutex
	idle    []*worker // the most recently parked last
	maxIdle int
	closed  bool
}

type worker struct {
	jobs     chan job
	parkedAt time.Time
}

// job is one request of one connection, or one batch of its requests. A
// struct rather than a closure, so handing it over allocates nothing.
type job struct {
	c  *conn
	sl *slot
	b  *windowBatch
	g  *groupBatcher
}

const (
	defaultMaxIdleWorkers = 1024
	workerIdleTimeout     = 10 * time.Second
)

// run runs j on a worker.
func (p *workers) run(j job) {
	p.mu.Lock()
	var w *worker
	if n := len(p.idle); n > 0 {
		w = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
	}
	// The longest-parked worker has not been needed for a while: let it go.
	var stale *worker
	if len(p.idle) > 0 && time.Since(p.idle[0].parkedAt) > workerIdleTimeout {
		stale = p.idle[0]
		p.idle[0] = nil
		p.idle = p.idle[1:]
	}
	p.mu.Unlock()
	if stale != nil {
		close(stale.jobs)
	}
	if w != nil {
		w.jobs <- j
		return
	}
	w = &worker{jobs: make(chan job, 1)}
	w.jobs <- j
	go p.loop(w)
}

func (p *workers) loop(w *worker) {
	for j := range w.jobs {
		if j.g != nil {
			j.g.loop(j.b)
		} else if j.b != nil {
			j.c.runBatch(j.b)
		} else {
			j.c.run(j.sl)
		}
		if !p.park(w) {
			return
		}
	}
}

func (p *workers) park(w *worker) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= p.maxIdle {
		return false
	}
	w.parkedAt = time.Now()
	p.idle = append(p.idle, w)
	return true
}

// close ends the idle workers; busy ones end after their request.
func (p *workers) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.closed = true
	p.mu.Unlock()
	for _, w := range idle {
		close(w.jobs)
	}
}
