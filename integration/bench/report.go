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

// ratio is the median over rounds of row i's rate over its baseline's in the
// same round.
func ratio(samples [][]sample, i int) float64 {
	j := matrix[i].baseline
	var xs []float64
	for k := range samples[i] {
		if k < len(samples[j]) && samples[j][k].rate > 0 {
			xs = append(xs, samples[i][k].rate/samples[j][k].rate)
		}
	}
	return median(xs)
}

func (b *bench) table(samples [][]sample) {
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\tdecisions/s\tvs in-process\tp50\tp99\tquotad CPU µs/dec\tredis CPU µs/dec\tclient CPU µs/dec\tscript µs/call\tredis cmds/dec\tredis conns\tquotad RSS MB\terrors\t")
	for i, r := range matrix {
		ss := samples[i]
		vs, sc, rss := "", "", ""
		if r.baseline >= 0 {
			vs = fmt.Sprintf("%.2fx", ratio(samples, i))
		}
		if r.sidecar {
			sc = fmt.Sprintf("%.1f", medianOf(ss, func(s sample) float64 { return s.sidecarCPU }))
			rss = fmt.Sprintf("%.0f", medianOf(ss, func(s sample) float64 { return float64(s.sidecarRSS) / (1 << 20) }))
		}
		var errs int64
		for _, s := range ss {
			errs += s.errors
		}
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%v\t%v\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%s\t%d\t\n", r.name,
			medianOf(ss, func(s sample) float64 { return s.rate }), vs,
			time.Duration(medianOf(ss, func(s sample) float64 { return float64(s.p50) })).Round(time.Microsecond),
			time.Duration(medianOf(ss, func(s sample) float64 { return float64(s.p99) })).Round(time.Microsecond),
			sc,
			medianOf(ss, func(s sample) float64 { return s.redisCPU }),
			medianOf(ss, func(s sample) float64 { return s.clientCPU }),
			medianOf(ss, func(s sample) float64 { return s.scriptUsec }),
			medianOf(ss, func(s sample) float64 { return s.redisCalls }),
			medianOf(ss, func(s sample) float64 { return float64(s.redisConns) }),
			rss, errs)
	}
	w.Flush()
	for i, r := range matrix {
		codes := map[protocol.Code]int64{}
		for _, s := range samples[i] {
			for c, n := range s.errorCodes {
				codes[c] += n
			}
		}
		if len(codes) > 0 {
			fmt.Fprintf(b.out, "error replies of %s, all rounds: %v\n", r.name, codes)
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAIL"
}

// checks runs the memory and hot-key checks and prints every target.
func (b *bench) checks(ctx context.Context, samples [][]sample) error {
	pipe, single := ratio(samples, 0), ratio(samples, 2)
	cpu := medianOf(samples[0], func(s sample) float64 { return s.sidecarCPU })
	conns := 0
	for i, r := range matrix {
		if r.sidecar {
			for _, s := range samples[i] {
				conns = max(conns, s.redisConns)
			}
		}
	}
	fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 1.0x  %s\n", "pipelining, quotad vs in-process", pipe, verdict(pipe >= 1.0))
	fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 0.7x  %s\n", "one at a time, quotad vs in-process", single, verdict(single >= 0.7))
	fmt.Fprintf(b.out, "%-58s %8.1f µs target <= 8 µs  %s\n", "quotad CPU per decision, pipelining", cpu, verdict(cpu <= 8))
	fmt.Fprintf(b.out, "%-58s %8d    target <= 4     %s\n", "quotad's Redis connections, most seen", conns, verdict(conns <= 4))
	fmt.Fprintf(b.out, "%-58s %8.1f µs (original script %.1f µs)\n", "Redis usec_per_call of quotad's take script",
		medianOf(samples[0], func(s sample) float64 { return s.scriptUsec }),
		medianOf(samples[1], func(s sample) float64 { return s.scriptUsec }))

	idle, err := b.idleCheck(ctx)
	if err != nil {
		return fmt.Errorf("idle connections: %w", err)
	}
	fmt.Fprintf(b.out, "%-58s %8.1f MB target <= 40 MB %s\n", fmt.Sprintf("RSS added by %d idle connections", b.o.idleConns), idle, verdict(idle <= 40))
	flood, err := b.floodCheck(ctx)
	if err != nil {
		return fmt.Errorf("flood: %w", err)
	}
	fmt.Fprintf(b.out, "%-58s %8.1f MB target < 256 MB %s\n", fmt.Sprintf("largest RSS, %d clients that never read, %v", b.o.floodConns, b.o.floodFor), flood, verdict(flood < 256))
	calls, takes, err := b.hotKeyCheck(ctx)
	if err != nil {
		return fmt.Errorf("hot key: %w", err)
	}
	per := float64(calls) / float64(max(takes, 1))
	fmt.Fprintf(b.out, "%-58s %8.4f   (%d script calls for %d takes) %s\n", "Redis calls per take on an exhausted subject", per, calls, takes, verdict(per < 0.01))
	return nil
}

// idleCheck opens connections that each send one ping and then stay open,
// and reports how much the sidecar's RSS grew, in MB.
func (b *bench) idleCheck(ctx context.Context) (float64, error) {
	pid := b.sidecar.Process.Pid
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
		c, err := d.DialContext(ctx, "unix", b.socket)
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
func (b *bench) floodCheck(ctx context.Context) (float64, error) {
	pid := b.sidecar.Process.Pid
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
		c, err := d.DialContext(ctx, "unix", b.socket)
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
func (b *bench) hotKeyCheck(ctx context.Context) (calls, takes int64, err error) {
	if err := b.do(ctx, "FLUSHALL", "SYNC"); err != nil {
		return 0, 0, err
	}
	// Exhaust it first: 10 takes of a limit of 10.
	c, err := protocol.Dial(ctx, b.socket)
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
	res, err := loadgen.Run(ctx, loadgen.Config{Socket: b.socket, Conns: 16, InFlight: 16, Duration: min(b.o.duration, 2*time.Second),
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
