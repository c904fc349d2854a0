// Command faultbench measures how a quotad build behaves when the network
// between it and Redis misbehaves. For each scenario it starts a private
// redis-server, a redistest.FaultProxy in front of it and the quotad binary
// on the proxy (--redis-timeout 300ms by default), drives takes from
// pipelining clients, injects the scenario's fault and prints what the
// clients were answered: decisions, outcomes unknown, takes not run, when
// the breaker opened, how long recovery took. After each run, with the
// fault gone, it checks what quotad promises under any fault (no subject
// over its limit, exact replays, a TTL on every key) and prints the
// violations. Each scenario runs -runs times; the tables show every run and
// the median.
//
//	go run ./integration/faultbench -quotad bin/quotad
//
// It asserts nothing about the figures; they are for people.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// windowMS is every take's fixed window: longer than a run and its checks,
// so that no window ends and a subject's accepted takes add up to at most
// its limit.
const windowMS = 3_600_000

// defaultTimeout is the sidecar's --redis-timeout unless -redis-timeout
// says otherwise: the figures in docs/performance.md are taken with it.
const defaultTimeout = 300 * time.Millisecond

type options struct {
	quotad    string
	runs      int
	only      string
	latencies []int // ms
	timeout   time.Duration
	conns     int
	inflight  int
	subjects  int
	limit     int64
}

func main() {
	var o options
	var lats string
	flag.StringVar(&o.quotad, "quotad", "bin/quotad", "quotad binary to measure")
	flag.IntVar(&o.runs, "runs", 3, "runs of each scenario; the tables show every run and the median")
	flag.StringVar(&o.only, "scenarios", "", "comma-separated scenarios to run (latency<ms>, fresh, flush, blackhole); empty runs all")
	flag.StringVar(&lats, "latencies", "150,180", "comma-separated latencies (ms) of the latency scenarios")
	flag.DurationVar(&o.timeout, "redis-timeout", defaultTimeout, "the sidecar's --redis-timeout")
	flag.IntVar(&o.conns, "conns", 16, "client connections")
	flag.IntVar(&o.inflight, "inflight", 8, "takes each connection keeps outstanding")
	flag.IntVar(&o.subjects, "subjects", 200, "subjects the takes spread over")
	flag.Int64Var(&o.limit, "limit", 20, "each subject's limit (one-hour fixed window), low so that limits are reached")
	flag.Parse()
	for _, s := range strings.Split(lats, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "-latencies: %q is not a number of milliseconds\n", s)
			os.Exit(2)
		}
		o.latencies = append(o.latencies, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, &o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "faultbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options, out io.Writer) error {
	if o.runs < 1 || o.conns < 1 || o.inflight < 1 || o.subjects < 1 || o.limit < 1 {
		return fmt.Errorf("-runs, -conns, -inflight, -subjects and -limit must be positive")
	}
	fmt.Fprintf(out, "quotad %s, --redis-timeout %v; %d connections x %d takes in flight over %d subjects, limit %d per one-hour window; %d runs, medians\n",
		o.quotad, o.timeout, o.conns, o.inflight, o.subjects, o.limit, o.runs)
	srcs := luascript.Sources()
	total := 0
	for _, src := range srcs {
		total += len(src)
	}
	// The fixed window's batch script is what a batch of these takes needs
	// loaded again after a flush.
	fmt.Fprintf(out, "scripts of this tree: %d, %d bytes in all, the fixed window's batch script %d bytes\n", len(srcs), total, len(luascript.BatchTexts()["batch_fixed_window.lua"]))
	ran := 0
	for _, sc := range scenarios(o) {
		if o.only != "" && !slices.Contains(strings.Split(o.only, ","), sc.name) {
			continue
		}
		ran++
		fmt.Fprintf(out, "\n## %s: %s\n\n", sc.name, sc.about)
		var runs [][]figure
		for i := range o.runs {
			figs, bad, err := runOnce(ctx, o, sc, i)
			if err != nil {
				return fmt.Errorf("%s run %d: %w", sc.name, i+1, err)
			}
			if len(bad) == 0 {
				fmt.Fprintf(out, "run %d: invariants hold (no subject over its limit, replays exact, every key has a TTL)\n", i+1)
			} else {
				fmt.Fprintf(out, "run %d: %d INVARIANT VIOLATIONS:\n  %s\n", i+1, len(bad), strings.Join(bad[:min(len(bad), 20)], "\n  "))
			}
			runs = append(runs, figs)
		}
		writeTable(out, runs)
	}
	if ran == 0 {
		return fmt.Errorf("no scenario named %q", o.only)
	}
	return nil
}

func runOnce(ctx context.Context, o *options, sc scenario, i int) ([]figure, []string, error) {
	dir, err := os.MkdirTemp("", "quotad-faultbench")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	e, err := newEnv(o, dir)
	if err != nil {
		return nil, nil, err
	}
	defer e.close()
	if !sc.fresh {
		if err := e.startQuotad(ctx); err != nil {
			return nil, nil, err
		}
	}
	l := &load{socket: e.socket, conns: o.conns, inflight: o.inflight, subjects: o.subjects, limit: o.limit, windowMS: windowMS}
	r, err := sc.run(ctx, e, l)
	if err != nil {
		return nil, nil, err
	}
	// The checks need Redis reachable again.
	e.proxy.SetLatency(redistest.Both, 0)
	e.proxy.SetBandwidth(redistest.Both, 0)
	e.proxy.Blackhole(false)
	if err := waitRedisUp(ctx, e); err != nil {
		return nil, nil, err
	}
	bf, err := breakerFigures(e, r)
	if err != nil {
		return nil, nil, err
	}
	bad, err := e.check(ctx, l, r.takes)
	return append(r.figs, bf...), bad, err
}

// waitRedisUp waits until the sidecar's breaker, if open, has closed.
func waitRedisUp(ctx context.Context, e *env) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ping(ctx, e.socket)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// writeTable prints one row per figure: each run's value, then the median.
func writeTable(out io.Writer, runs [][]figure) {
	if len(runs) == 0 {
		return
	}
	fmt.Fprint(out, "\n| figure |")
	for i := range runs {
		fmt.Fprintf(out, " run %d |", i+1)
	}
	fmt.Fprint(out, " median |\n|---|")
	for range runs {
		fmt.Fprint(out, "---:|")
	}
	fmt.Fprintln(out, "---:|")
	for f, fig := range runs[0] {
		fmt.Fprintf(out, "| %s |", fig.name)
		vals := make([]float64, 0, len(runs))
		for _, r := range runs {
			fmt.Fprintf(out, " %s |", format(r[f].value))
			vals = append(vals, r[f].value)
		}
		fmt.Fprintf(out, " %s |\n", format(median(vals)))
	}
}

// median of the values that are numbers; NaN (did not happen) sorts first,
// so a median of NaN says it did not happen in most runs.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.SortFunc(s, func(a, b float64) int {
		switch {
		case math.IsNaN(a) && math.IsNaN(b):
			return 0
		case math.IsNaN(a):
			return -1
		case math.IsNaN(b):
			return 1
		}
		return cmp.Compare(a, b)
	})
	return s[len(s)/2]
}

func format(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v == math.Trunc(v) || math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}
