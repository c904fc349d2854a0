package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"quotad/integration/redistest"
)

// figure is one number a scenario measured; NaN when it did not happen
// (a breaker that never opened has no time of opening).
type figure struct {
	name  string
	value float64
}

// scenario is one fault and what it measures. fresh scenarios start the
// sidecar themselves, after putting the fault in place.
type scenario struct {
	name  string
	about string
	fresh bool
	run   func(ctx context.Context, e *env, l *load) (result, error)
}

// result is what a scenario measured, every take, and when its fault
// began and ended, from which the breaker's figures are taken once Redis
// is reachable again.
type result struct {
	figs       []figure
	takes      []take
	start, end time.Time
}

func scenarios(o *options) []scenario {
	var out []scenario
	for _, ms := range o.latencies {
		lat := time.Duration(ms) * time.Millisecond
		out = append(out, scenario{
			name:  fmt.Sprintf("latency%d", ms),
			about: fmt.Sprintf("%v added to every reply for 5 s, after 1 s without faults", lat),
			run: func(ctx context.Context, e *env, l *load) (result, error) {
				return latency(ctx, e, l, lat)
			},
		})
	}
	return append(out,
		scenario{name: "fresh", about: "a sidecar started behind 100 ms added to every reply, then 3 s of load", fresh: true, run: fresh},
		scenario{name: "flush", about: "1 s without faults, 3 s on a 50 KB/s link (each way), SCRIPT FLUSH, 10 s more", run: flush},
		scenario{name: "blackhole", about: "1 s without faults, a 2 s blackhole, 5 s more", run: blackhole},
	)
}

// step is something done to the world at an offset of a run.
type step struct {
	at time.Duration
	do func(ctx context.Context) error
}

// drive runs the load for total while the steps happen on time, and
// returns every take, when the load started, and when each step was done.
func drive(ctx context.Context, l *load, total time.Duration, steps ...step) ([]take, time.Time, []time.Time, error) {
	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(total))
	defer cancel()
	var takes []take
	var loadErr error
	var wg sync.WaitGroup
	wg.Go(func() { takes, loadErr = l.run(runCtx, fmt.Sprintf("r%d", start.UnixNano())) })
	done := make([]time.Time, len(steps))
	var stepErr error
	for i, s := range steps {
		select {
		case <-time.After(time.Until(start.Add(s.at))):
		case <-runCtx.Done():
		}
		done[i] = time.Now()
		if err := s.do(ctx); err != nil && stepErr == nil {
			stepErr = fmt.Errorf("step at %v: %w", s.at, err)
			cancel()
		}
	}
	wg.Wait()
	if stepErr != nil {
		return takes, start, done, stepErr
	}
	return takes, start, done, loadErr
}

// tally counts the replies that came in [from, to) by kind.
func tally(takes []take, from, to time.Time) [kinds]int {
	var n [kinds]int
	for i := range takes {
		if t := takes[i].got; !t.IsZero() && !t.Before(from) && t.Before(to) {
			n[takes[i].kind]++
		}
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// breakerFigures are, from the sidecar's log once Redis is reachable
// again: when the breaker first opened after the fault began (ms), how
// often it opened, how long it stayed open in all (ms), and how long after
// the fault ended it closed for good (ms; 0 when it was closed then); and,
// from the replies, how many takes it refused.
func breakerFigures(e *env, r result) ([]figure, error) {
	evs, err := e.breakerEvents()
	if err != nil {
		return nil, err
	}
	// The log's times are to the millisecond.
	from := r.start.Truncate(time.Millisecond)
	first, opens, open, closed := math.NaN(), 0.0, time.Duration(0), 0.0
	var openedAt time.Time
	for _, ev := range evs {
		if ev.at.Before(from) {
			continue
		}
		switch {
		case ev.open && openedAt.IsZero():
			opens++
			if math.IsNaN(first) {
				first = ms(ev.at.Sub(r.start))
			}
			openedAt = ev.at
		case !ev.open && !openedAt.IsZero():
			open += ev.at.Sub(openedAt)
			if ev.at.After(r.end) {
				closed = ms(ev.at.Sub(r.end))
			}
			openedAt = time.Time{}
		}
	}
	refused := 0
	for i := range r.takes {
		if tk := &r.takes[i]; tk.kind == kindBreaker && !tk.got.Before(r.start) {
			refused++
		}
	}
	return []figure{
		{"breaker first opened (ms after the fault began)", first},
		{"breaker opens", opens},
		{"breaker open in all (ms)", ms(open)},
		{"breaker closed for good (ms after the fault ended)", closed},
		{"takes refused by the breaker (no backoff in the clients)", float64(refused)},
	}, nil
}

func kindFigures(n [kinds]int) []figure {
	figs := make([]figure, 0, kinds)
	for k := range kinds {
		figs = append(figs, figure{kindNames[k], float64(n[k])})
	}
	return figs
}

func latency(ctx context.Context, e *env, l *load, lat time.Duration) (result, error) {
	takes, _, at, err := drive(ctx, l, 7*time.Second,
		step{1 * time.Second, func(context.Context) error { e.proxy.SetLatency(redistest.ToClient, lat); return nil }},
		step{6 * time.Second, func(context.Context) error { e.proxy.SetLatency(redistest.ToClient, 0); return nil }},
	)
	r := result{takes: takes, start: at[0], end: at[1]}
	if err != nil {
		return r, err
	}
	// Replies to takes sent under the fault come up to a deadline after it.
	n := tally(takes, r.start, r.end.Add(e.o.timeout+lat))
	r.figs = append(kindFigures(n), figure{"decisions/s under the fault", float64(n[kindDecided]) / r.end.Sub(r.start).Seconds()})
	return r, nil
}

func fresh(ctx context.Context, e *env, l *load) (result, error) {
	const lat = 100 * time.Millisecond
	e.proxy.SetLatency(redistest.ToClient, lat)
	if err := e.startQuotad(ctx); err != nil {
		return result{}, err
	}
	takes, start, _, err := drive(ctx, l, 3*time.Second)
	r := result{takes: takes, start: start, end: time.Now()}
	if err != nil {
		return r, err
	}
	// The first batch: the first luascript.MaxBatch takes sent.
	sorted := slices.Clone(takes)
	slices.SortFunc(sorted, func(a, b take) int { return a.sent.Compare(b.sent) })
	var first [kinds]int
	for i := range min(64, len(sorted)) {
		first[sorted[i].kind]++
	}
	firstReply := math.NaN()
	if len(sorted) > 0 && !sorted[0].got.IsZero() {
		firstReply = ms(sorted[0].got.Sub(sorted[0].sent))
	}
	firstDecided := math.NaN()
	for i := range sorted {
		if sorted[i].kind == kindDecided && (math.IsNaN(firstDecided) || ms(sorted[i].got.Sub(start)) < firstDecided) {
			firstDecided = ms(sorted[i].got.Sub(start))
		}
	}
	r.figs = []figure{
		{"first take answered after (ms)", firstReply},
		{"first take decided (1) or not (0)", b2f(len(sorted) > 0 && sorted[0].kind == kindDecided)},
		{"of the first 64 takes: decided", float64(first[kindDecided])},
		{"of the first 64 takes: outcome unknown", float64(first[kindTimeout] + first[kindUnknown])},
		{"of the first 64 takes: not run", float64(first[kindWaited] + first[kindBreaker] + first[kindNotRun])},
		{"first decision after (ms from the first take)", firstDecided},
	}
	r.figs = append(r.figs, kindFigures(tally(takes, start, start.Add(time.Hour)))...)
	return r, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func flush(ctx context.Context, e *env, l *load) (result, error) {
	const rate = 50_000
	var capBytes, flushBytes, evals0 int64
	takes, _, at, err := drive(ctx, l, 14*time.Second,
		step{1 * time.Second, func(context.Context) error {
			e.proxy.SetBandwidth(redistest.Both, rate)
			capBytes = e.proxy.Bytes(redistest.ToServer)
			return nil
		}},
		step{4 * time.Second, func(ctx context.Context) error {
			flushBytes = e.proxy.Bytes(redistest.ToServer)
			var err error
			if evals0, err = e.commandCalls(ctx, "eval"); err != nil {
				return err
			}
			return e.redisDo(ctx, "SCRIPT", "FLUSH").Error()
		}},
	)
	capped, flushed := at[0], at[1]
	r := result{takes: takes, start: flushed, end: time.Now()}
	if err != nil {
		return r, err
	}
	end := e.proxy.Bytes(redistest.ToServer)
	evals, err := e.commandCalls(ctx, "eval")
	if err != nil {
		return r, err
	}
	control := tally(takes, capped, flushed)
	controlSecs := flushed.Sub(capped).Seconds()
	var got []time.Time
	for i := range takes {
		if takes[i].kind == kindDecided && takes[i].got.After(flushed) {
			got = append(got, takes[i].got)
		}
	}
	slices.SortFunc(got, time.Time.Compare)
	gap, prev := time.Duration(0), flushed
	for _, t := range append(got, flushed.Add(10*time.Second)) {
		gap = max(gap, t.Sub(prev))
		prev = t
	}
	after := tally(takes, flushed, flushed.Add(time.Hour))
	r.figs = []figure{
		{"decisions/s on the capped link before the flush", float64(control[kindDecided]) / controlSecs},
		{"decisions in the 10 s after the flush", float64(after[kindDecided])},
		{"longest time without a decision after the flush (ms)", ms(gap)},
		{"EVAL calls after the flush (each carries a script)", float64(evals - evals0)},
		{"bytes to redis in the 10 s after the flush", float64(end - flushBytes)},
		{"bytes to redis per 10 s on the capped link before the flush", float64(flushBytes-capBytes) / controlSecs * 10},
	}
	r.figs = append(r.figs, kindFigures(after)...)
	return r, nil
}

func blackhole(ctx context.Context, e *env, l *load) (result, error) {
	takes, _, at, err := drive(ctx, l, 8*time.Second,
		step{1 * time.Second, func(context.Context) error { e.proxy.Blackhole(true); return nil }},
		step{3 * time.Second, func(context.Context) error { e.proxy.Blackhole(false); return nil }},
	)
	r := result{takes: takes, start: at[0], end: at[1]}
	if err != nil {
		return r, err
	}
	firstDecided, lastError := math.NaN(), math.NaN()
	for i := range takes {
		tk := &takes[i]
		if tk.got.Before(r.end) {
			continue
		}
		d := ms(tk.got.Sub(r.end))
		if tk.kind == kindDecided {
			if math.IsNaN(firstDecided) || d < firstDecided {
				firstDecided = d
			}
		} else if math.IsNaN(lastError) || d > lastError {
			lastError = d
		}
	}
	r.figs = []figure{
		{"first decision after the heal (ms)", firstDecided},
		{"last error reply after the heal (ms)", lastError},
	}
	r.figs = append(r.figs, kindFigures(tally(takes, r.start, r.start.Add(time.Hour)))...)
	return r, nil
}
