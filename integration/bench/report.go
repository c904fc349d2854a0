package main

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"quotad/loadgen"
	"quotad/protocol"
)

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianOf(ss []sample, f func(sample) float64) float64 {
	xs := make([]float64, len(ss))
	for i, s := range ss {
		xs[i] = f(s)
	}
	return median(xs)
}

// pairedRatio is the median over rounds of f of a's sample over f of b's in
// the same round.
func pairedRatio(a, b []sample, f func(sample) float64) float64 {
	var xs []float64
	for k := range a {
		if k < len(b) && f(b[k]) > 0 {
			xs = append(xs, f(a[k])/f(b[k]))
		}
	}
	return median(xs)
}

// pairedRange is the least and the most of the rounds' ratios of
// pairedRatio.
func pairedRange(a, b []sample, f func(sample) float64) (lo, hi float64) {
	first := true
	for k := range a {
		if k < len(b) && f(b[k]) > 0 {
			x := f(a[k]) / f(b[k])
			if first || x < lo {
				lo = x
			}
			if first || x > hi {
				hi = x
			}
			first = false
		}
	}
	return lo, hi
}

func rate(s sample) float64 { return s.rate }

func redisCPU(s sample) float64 { return s.redisCPU }

// ratio is the median over rounds of row i's rate with build k over its
// in-process row's in the same round.
func ratio(samples [][][]sample, i, k int) float64 {
	return pairedRatio(samples[i][k], samples[matrix[i].inProcess][0], rate)
}

// of is row i's samples with build k; an in-process row has one.
func of(samples [][][]sample, i, k int) []sample {
	if !matrix[i].sidecar {
		return samples[i][0]
	}
	if k >= len(samples[i]) {
		return nil // a row of the main build only
	}
	return samples[i][k]
}

func dur(ss []sample, f func(sample) time.Duration) time.Duration {
	return time.Duration(medianOf(ss, func(s sample) float64 { return float64(f(s)) })).Round(time.Microsecond)
}

// table prints every row measured with build k.
func (b *bench) table(samples [][][]sample, k int) {
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\tdecisions/s\tvs in-process\tp50\tp99\tquotad CPU µs/dec\tredis CPU µs/dec\tvs original\tclient CPU µs/dec\tscript µs/call\tdec/script call\tredis cmds/dec\tprobe p99\tredis conns\tquotad RSS MB\terrors\t")
	for i, r := range matrix {
		ss := of(samples, i, k)
		if len(ss) == 0 {
			continue // a main-only row on the baseline, or a row not measured
		}
		vs, vsCPU, sc, rss := "", "", "", ""
		if r.inProcess >= 0 {
			vs = fmt.Sprintf("%.2fx", ratio(samples, i, k))
			vsCPU = fmt.Sprintf("%.2fx", pairedRatio(ss, samples[r.inProcess][0], redisCPU))
		}
		if r.sidecar {
			sc = fmt.Sprintf("%.1f", medianOf(ss, func(s sample) float64 { return s.sidecarCPU }))
			rss = fmt.Sprintf("%.0f", medianOf(ss, func(s sample) float64 { return float64(s.sidecarRSS) / (1 << 20) }))
		}
		var errs int64
		for _, s := range ss {
			errs += s.errors
		}
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%v\t%v\t%s\t%.1f\t%s\t%.1f\t%.1f\t%.2f\t%.1f\t%v\t%.0f\t%s\t%d\t\n", r.name,
			medianOf(ss, rate), vs,
			dur(ss, func(s sample) time.Duration { return s.p50 }),
			dur(ss, func(s sample) time.Duration { return s.p99 }),
			sc,
			medianOf(ss, redisCPU), vsCPU,
			medianOf(ss, func(s sample) float64 { return s.clientCPU }),
			medianOf(ss, func(s sample) float64 { return s.scriptUsec }),
			medianOf(ss, sample.decPerScript),
			medianOf(ss, func(s sample) float64 { return s.redisCalls }),
			dur(ss, func(s sample) time.Duration { return s.probeP99 }),
			medianOf(ss, func(s sample) float64 { return float64(s.redisConns) }),
			rss, errs)
	}
	w.Flush()
	for i, r := range matrix {
		codes := map[protocol.Code]int64{}
		for _, s := range of(samples, i, k) {
			for c, n := range s.errorCodes {
				codes[c] += n
			}
		}
		if len(codes) > 0 {
			fmt.Fprintf(b.out, "error replies of %s, all rounds: %v\n", r.name, codes)
		}
	}
}

// maxLoss is the most a row may lose to the baseline build.
const maxLoss = 0.05

// compare prints every quotad row of the main build beside the baseline
// build's, with the change of each: the median over rounds of the main
// build's figure over the baseline's in the same round.
func (b *bench) compare(samples [][][]sample) {
	fmt.Fprintf(b.out, "main build against the baseline build (change: median of the rounds' main/baseline - 1; rounds' changes: the least and the most):\n")
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\tdecisions/s main\tbaseline\tchange\trounds' changes\tvs in-process main\tbaseline\tquotad CPU µs/dec main\tbaseline\tchange\tredis CPU µs/dec main\tbaseline\tdec/script call main\tbaseline\tp50 main\tbaseline\tp99 main\tbaseline\t")
	cpu := func(s sample) float64 { return s.sidecarCPU }
	rcpu := redisCPU
	var lost []string
	for i, r := range matrix {
		if !r.sidecar || r.mainOnly || !b.measured(i) {
			continue
		}
		m, base := samples[i][0], samples[i][1]
		dRate := pairedRatio(m, base, rate) - 1
		if dRate < -maxLoss {
			lost = append(lost, fmt.Sprintf("%s %+.1f%%", r.name, 100*dRate))
		}
		lo, hi := pairedRange(m, base, rate)
		fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%+.1f%%\t%+.1f%% to %+.1f%%\t%.2fx\t%.2fx\t%.1f\t%.1f\t%+.1f%%\t%.1f\t%.1f\t%.2f\t%.2f\t%v\t%v\t%v\t%v\t\n", r.name,
			medianOf(m, rate), medianOf(base, rate), 100*dRate, 100*(lo-1), 100*(hi-1),
			ratio(samples, i, 0), ratio(samples, i, 1),
			medianOf(m, cpu), medianOf(base, cpu), 100*(pairedRatio(m, base, cpu)-1),
			medianOf(m, rcpu), medianOf(base, rcpu),
			medianOf(m, sample.decPerScript), medianOf(base, sample.decPerScript),
			dur(m, func(s sample) time.Duration { return s.p50 }), dur(base, func(s sample) time.Duration { return s.p50 }),
			dur(m, func(s sample) time.Duration { return s.p99 }), dur(base, func(s sample) time.Duration { return s.p99 }))
	}
	w.Flush()
	if len(lost) == 0 {
		fmt.Fprintf(b.out, "%-58s %8s   target: no row below -%.0f%%  ok\n", "decisions/s, main against baseline", "none", 100*maxLoss)
	} else {
		fmt.Fprintf(b.out, "%-58s %8d   target: no row below -%.0f%%  FAIL: %s\n", "decisions/s, main against baseline", len(lost), 100*maxLoss, strings.Join(lost, "; "))
	}
}

func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAIL"
}

// checks runs the memory and hot-key checks on build k and prints every
// target.
func (b *bench) checks(ctx context.Context, samples [][][]sample, k int) error {
	sc := b.sidecars[k]
	label := func(s string) string {
		if len(b.sidecars) > 1 {
			return sc.label + ": " + s
		}
		return s
	}
	pipe, pipeIDs, single := ratio(samples, rowPipelining, k), ratio(samples, rowPipeliningIDs, k), ratio(samples, rowOneAtATime, k)
	cpu := medianOf(samples[rowPipelining][k], func(s sample) float64 { return s.sidecarCPU })
	conns := 0
	for i, r := range matrix {
		if r.sidecar && !r.reference {
			for _, s := range of(samples, i, k) {
				conns = max(conns, s.redisConns)
			}
		}
	}
	fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 1.4x  %s\n", label("pipelining, quotad vs in-process"), pipe, verdict(pipe >= 1.4))
	if b.measured(rowPipeliningIDs) {
		fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 1.4x  %s\n", label("pipelining with request ids, quotad vs in-process"), pipeIDs, verdict(pipeIDs >= 1.4))
	}
	fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 0.7x  %s\n", label("one at a time, quotad vs in-process"), single, verdict(single >= 0.7))
	fmt.Fprintf(b.out, "%-58s %8.1f µs target <= 5 µs  %s\n", label("quotad CPU per decision, pipelining"), cpu, verdict(cpu <= 5))
	fmt.Fprintf(b.out, "%-58s %8d    target <= 4     %s\n", label("quotad's Redis connections, most seen"), conns, verdict(conns <= 4))
	// A batch script call decides many: its time is read per decision.
	scriptPerDecision := func(s sample) float64 {
		if d := s.decPerScript(); d > 0 {
			return s.scriptUsec / d
		}
		return 0
	}
	fmt.Fprintf(b.out, "%-58s %8.1f µs (original script %.1f µs)\n", label("Redis usec_per_call of quotad's scripts, per decision"),
		medianOf(samples[rowPipelining][k], scriptPerDecision),
		medianOf(samples[rowInProcPipe][0], scriptPerDecision))
	fmt.Fprintf(b.out, "%-58s %8.2f\n", label("decisions per script call, fixed window, pipelining"),
		medianOf(samples[rowPipelining][k], sample.decPerScript))
	for _, row := range []int{rowPipelining, rowPipeliningIDs} {
		if !b.measured(row) {
			continue
		}
		name := "Redis CPU per decision, fixed window, pipelining"
		if row == rowPipeliningIDs {
			name += ", ids"
		}
		rc := medianOf(samples[row][k], redisCPU)
		fmt.Fprintf(b.out, "%-58s %8.1f µs target <= 7 µs  %s (original script %.1f µs)\n", label(name), rc, verdict(rc <= 7),
			medianOf(samples[rowInProcPipe][0], redisCPU))
	}
	for _, row := range []int{rowTokenBucket, rowSliding} {
		ss := of(samples, row, k)
		if len(ss) == 0 {
			continue // a main-only row on the baseline, or a row not measured
		}
		x := pairedRatio(ss, samples[rowPipelining][k], rate)
		fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 0.8x  %s\n", label(matrix[row].name+" vs fixed window"), x, verdict(x >= 0.8))
	}
	if k == 0 {
		b.rlsChecks(samples)
	}
	fmt.Fprintf(b.out, "%-58s %8v    (in-process client: %v; one at a time: %v)\n", label("PING p99 of another Redis client, pipelining"),
		dur(samples[rowPipelining][k], func(s sample) time.Duration { return s.probeP99 }),
		dur(samples[rowInProcPipe][0], func(s sample) time.Duration { return s.probeP99 }),
		dur(samples[rowOneAtATime][k], func(s sample) time.Duration { return s.probeP99 }))
	b.allotmentChecks(samples, k, label)

	idle, err := b.idleCheck(ctx, sc)
	if err != nil {
		return fmt.Errorf("idle connections: %w", err)
	}
	fmt.Fprintf(b.out, "%-58s %8.1f MB target <= 40 MB %s\n", label(fmt.Sprintf("RSS added by %d idle connections", b.o.idleConns)), idle, verdict(idle <= 40))
	flood, err := b.floodCheck(ctx, sc)
	if err != nil {
		return fmt.Errorf("flood: %w", err)
	}
	fmt.Fprintf(b.out, "%-58s %8.1f MB target < 256 MB %s\n", label(fmt.Sprintf("largest RSS, %d clients that never read, %v", b.o.floodConns, b.o.floodFor)), flood, verdict(flood < 256))
	calls, takes, err := b.hotKeyCheck(ctx, sc)
	if err != nil {
		return fmt.Errorf("hot key: %w", err)
	}
	per := float64(calls) / float64(max(takes, 1))
	fmt.Fprintf(b.out, "%-58s %8.4f   (%d script calls for %d takes) %s\n", label("Redis calls per take on an exhausted subject"), per, calls, takes, verdict(per < 0.01))
	return nil
}

// idleCheck opens connections that each send one ping and then stay open,
// and reports how much the sidecar's RSS grew, in MB.
func (b *bench) idleCheck(ctx context.Context, sc *sidecar) (float64, error) {
	pid := sc.cmd.Process.Pid
	before, err := rssBytes(pid)
	if err != nil {
		return 0, err
	}
	conns := make([]net.Conn, 0, b.o.idleConns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	buf := make([]byte, 512)
	for range b.o.idleConns {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sc.socket)
		if err != nil {
			return 0, err
		}
		conns = append(conns, c)
		// The reply proves the sidecar is serving this connection.
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte(`{"op":"ping"}` + "\n")); err != nil {
			return 0, err
		}
		if _, err := c.Read(buf); err != nil {
			return 0, err
		}
	}
	time.Sleep(500 * time.Millisecond) // let the runtime settle after the burst
	after, err := rssBytes(pid)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / (1 << 20), nil
}

// floodCheck has clients write takes as fast as they can and never read a
// reply, and reports the sidecar's largest RSS meanwhile, in MB.
func (b *bench) floodCheck(ctx context.Context, sc *sidecar) (float64, error) {
	pid := sc.cmd.Process.Pid
	var chunk []byte
	for i := range 500 {
		chunk = fmt.Appendf(chunk, `{"op":"take","subject":"flood-%d","limit":%d,"window_ms":%d}`+"\n", i, limit, windowMS)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var written atomic.Int64
	conns := make([]net.Conn, 0, b.o.floodConns)
	for range b.o.floodConns {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sc.socket)
		if err != nil {
			close(stop)
			for _, c := range conns {
				c.Close()
			}
			return 0, err
		}
		conns = append(conns, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				n, _ := c.Write(chunk)
				written.Add(int64(n))
			}
		}()
	}
	var peak int64
	end := time.Now().Add(b.o.floodFor)
	for time.Now().Before(end) {
		if rss, err := rssBytes(pid); err == nil {
			peak = max(peak, rss)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	for _, c := range conns {
		c.Close()
	}
	if written.Load() == 0 {
		return 0, fmt.Errorf("the flood wrote nothing")
	}
	return float64(peak) / (1 << 20), nil
}

const hotLimit = 10

// hotKeyCheck exhausts one subject, floods it with takes without a
// request_id, and returns the script calls Redis served for them.
func (b *bench) hotKeyCheck(ctx context.Context, sc *sidecar) (calls, takes int64, err error) {
	if err := b.do(ctx, "FLUSHALL", "SYNC"); err != nil {
		return 0, 0, err
	}
	// The flood before may have opened the sidecar's breaker: wait until it
	// decides again.
	if err := waitDeciding(ctx, sc.socket); err != nil {
		return 0, 0, err
	}
	// Exhaust it first: 10 takes of a limit of 10.
	c, err := protocol.Dial(ctx, sc.socket)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	for i := range hotLimit {
		r, raw, err := c.Call(ctx, map[string]any{"op": "take", "subject": "hot0", "limit": hotLimit, "window_ms": windowMS})
		if err != nil {
			return 0, 0, err
		}
		if !r.Allowed {
			return 0, 0, fmt.Errorf("take %d of %d was not allowed: %s", i+1, hotLimit, raw)
		}
	}
	if err := b.do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		return 0, 0, err
	}
	res, err := loadgen.Run(ctx, loadgen.Config{Socket: sc.socket, Conns: 16, InFlight: 16, Duration: min(b.o.duration, 2*time.Second),
		Subjects: 1, SubjectPrefix: "hot", Limit: hotLimit, WindowMS: windowMS})
	if err != nil {
		return 0, 0, err
	}
	if res.Allowed != 0 || res.Denied != res.Replies {
		return 0, 0, fmt.Errorf("an exhausted subject was not denied every time: %d allowed, %d denied of %d", res.Allowed, res.Denied, res.Replies)
	}
	stats, err := b.commandStats(ctx)
	if err != nil {
		return 0, 0, err
	}
	for name, st := range stats {
		if strings.HasPrefix(name, "eval") {
			calls += st.calls
		}
	}
	return calls, res.Replies, nil
}

// waitDeciding waits until the sidecar at socket grants a take, for at
// most 30 s.
func waitDeciding(ctx context.Context, socket string) error {
	c, err := protocol.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, raw, err := c.Call(ctx, map[string]any{"op": "take", "subject": "warm", "limit": limit, "window_ms": windowMS})
		switch {
		case err != nil:
			return err
		case r.Allowed:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("the sidecar still refuses takes after 30 s: %s", raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rlsChecks prints the targets of Envoy's rate limit service, measured on
// the main build only: its decisions/s against the socket's doing the same
// decisions, and quotad's CPU per request of each, paired by round.
func (b *bench) rlsChecks(samples [][][]sample) {
	cpu := func(s sample) float64 { return s.sidecarCPU }
	for _, p := range []struct{ rls, socket, shape string }{
		{rowRLSPipe, rowRLSSocketPipe, "64x16"},
		{rowRLSOne, rowRLSSocketOne, "16x1"},
	} {
		r, s := rowNamed(p.rls), rowNamed(p.socket)
		if !b.measured(r) || !b.measured(s) {
			continue
		}
		x := pairedRatio(samples[r][0], samples[s][0], rate)
		fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 0.7x  %s\n", "RLS vs socket decisions/s, 2 descriptors, "+p.shape, x, verdict(x >= 0.7))
		c := pairedRatio(samples[r][0], samples[s][0], cpu)
		fmt.Fprintf(b.out, "%-58s %8.2fx  target <= 2x    %s (%.1f µs against %.1f µs)\n", "quotad CPU per request, RLS vs socket, "+p.shape, c, verdict(c <= 2),
			medianOf(samples[r][0], cpu), medianOf(samples[s][0], cpu))
	}
	for _, p := range []struct{ floor, rls, socket, shape string }{
		{rowFloorPipe, rowRLSPipe, rowRLSSocketPipe, "64x16"},
		{rowFloorOne, rowRLSOne, rowRLSSocketOne, "16x1"},
	} {
		f, r, s := rowNamed(p.floor), rowNamed(p.rls), rowNamed(p.socket)
		if !b.measured(f) || !b.measured(r) || !b.measured(s) {
			continue
		}
		floor, socket := medianOf(samples[f][0], cpu), medianOf(samples[s][0], cpu)
		fmt.Fprintf(b.out, "%-58s %8.2fx  (%.1f µs: grpc-go alone, against a whole socket request's %.1f µs)\n", "gRPC floor CPU per call vs socket request, "+p.shape,
			pairedRatio(samples[f][0], samples[s][0], cpu), floor, socket)
		above := medianOf(samples[r][0], cpu) - floor
		fmt.Fprintf(b.out, "%-58s %8.2fx  (%.1f µs above the floor: matching, deciding, answering)\n", "quotad CPU per RLS request above the floor vs socket, "+p.shape,
			above/socket, above)
	}
	for _, p := range []struct{ reference, rls, shape string }{
		{rowReferencePipe, rowRLSPipe, "64x16"},
		{rowReferenceOne, rowRLSOne, "16x1"},
	} {
		ref, r := rowNamed(p.reference), rowNamed(p.rls)
		if !b.measured(ref) || !b.measured(r) {
			continue
		}
		fmt.Fprintf(b.out, "%-58s %8.2fx  (CPU per request %.1f µs against quotad's %.1f µs)\n", "envoyproxy/ratelimit vs quotad RLS decisions/s, "+p.shape,
			pairedRatio(samples[ref][0], samples[r][0], rate), medianOf(samples[ref][0], cpu), medianOf(samples[r][0], cpu))
	}
}
