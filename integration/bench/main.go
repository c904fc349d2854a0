// Command bench is `make bench`: it starts a private redis-server, a quotad
// sidecar on it, and an in-process rueidis client running the design
// documents' original quota script on the same Redis, then measures them in
// alternating rounds and prints one table. It asserts nothing; the figures
// are for people, and the checks print "ok" or "FAIL" beside their targets.
//
// Knobs (flags, or the environment variables make bench passes):
// BENCH_DURATION per measurement, BENCH_ROUNDS, BENCH_SIDECAR_ARGS extra
// `quotad serve` flags for trying tuning options.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/loadgen"
	"quotad/protocol"
)

//go:embed original.lua
var originalSrc string

// The workload every row runs: takes of cost 1 spread over subjects at
// random, with a limit no row reaches within a measurement, so that every
// decision is a full read-check-write.
const (
	limit    = 10_000 // the original script's largest limit
	windowMS = 60_000
)

type options struct {
	quotad      string
	duration    time.Duration
	rounds      int
	subjects    int
	idleConns   int
	floodConns  int
	floodFor    time.Duration
	sidecarArgs string
}

func main() {
	var o options
	flag.StringVar(&o.quotad, "quotad", "bin/quotad", "quotad binary to measure")
	flag.DurationVar(&o.duration, "duration", envDuration("BENCH_DURATION", 5*time.Second), "length of each measurement (BENCH_DURATION)")
	flag.IntVar(&o.rounds, "rounds", envInt("BENCH_ROUNDS", 3), "rounds of the matrix; the table shows medians (BENCH_ROUNDS)")
	flag.IntVar(&o.subjects, "subjects", 10_000, "distinct subjects")
	flag.IntVar(&o.idleConns, "idle-conns", 2000, "connections of the idle-memory check")
	flag.IntVar(&o.floodConns, "flood-conns", 100, "connections of the flood check")
	flag.DurationVar(&o.floodFor, "flood-duration", 5*time.Second, "length of the flood check")
	flag.StringVar(&o.sidecarArgs, "sidecar-args", os.Getenv("BENCH_SIDECAR_ARGS"), "extra flags for quotad serve (BENCH_SIDECAR_ARGS)")
	flag.Parse()
	if err := run(context.Background(), o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// row is one configuration of the matrix.
type row struct {
	name       string
	sidecar    bool
	conns      int // socket connections, or goroutines in process
	inflight   int
	requestIDs bool
	baseline   int // index of the in-process row this one is compared with; -1 for none
}

var matrix = []row{
	{name: "quotad, pipelining 64 conns x 16", sidecar: true, conns: 64, inflight: 16, baseline: 1},
	{name: "in-process, 1024 goroutines", conns: 1024, inflight: 1, baseline: -1},
	{name: "quotad, one at a time 16 conns x 1", sidecar: true, conns: 16, inflight: 1, baseline: 3},
	{name: "in-process, 16 goroutines", conns: 16, inflight: 1, baseline: -1},
	{name: "quotad, pipelining 64x16, request ids", sidecar: true, conns: 64, inflight: 16, requestIDs: true, baseline: 1},
}

// sample is one measurement of one row.
type sample struct {
	rate       float64
	p50, p99   time.Duration
	errors     int64
	sidecarCPU float64 // µs per decision
	redisCPU   float64
	clientCPU  float64
	scriptUsec float64 // Redis's usec_per_call of the script
	redisCalls float64 // Redis commands per decision, the script and those it ran
	redisConns int     // connections of the measured client to Redis
	sidecarRSS int64
	decisions  int64
	errorCodes map[protocol.Code]int64 // quotad rows only
}

type bench struct {
	o       options
	out     io.Writer
	dir     string
	redis   *redistest.Server
	ctl     rueidis.Client
	sidecar *exec.Cmd
	socket  string
	exited  chan struct{}
}

func run(ctx context.Context, o options, out io.Writer) (err error) {
	if _, err := os.Stat(o.quotad); err != nil {
		return fmt.Errorf("quotad binary: %w (run make build first)", err)
	}
	dir, err := os.MkdirTemp("", "quotad-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b := &bench{o: o, out: out, dir: dir}
	if b.redis, err = redistest.Launch(dir); err != nil {
		return err
	}
	defer b.redis.Close()
	if b.ctl, err = rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{b.redis.Addr()}, DisableCache: true, ForceSingleClient: true,
		ClientName: "bench-control", PipelineMultiplex: -1,
	}); err != nil {
		return fmt.Errorf("connect to redis: %w", err)
	}
	defer b.ctl.Close()
	if err := b.startSidecar(ctx); err != nil {
		return err
	}
	defer b.stopSidecar()

	b.header()
	samples := make([][]sample, len(matrix))
	for round := 1; round <= o.rounds; round++ {
		// Alternate the order, so that neither side always runs on a
		// machine warmed (or tired) by the other.
		order := make([]int, len(matrix))
		for i := range order {
			order[i] = i
			if round%2 == 0 {
				order[i] = len(matrix) - 1 - i
			}
		}
		for _, i := range order {
			s, err := b.measure(ctx, matrix[i], round)
			if err != nil {
				return fmt.Errorf("%s: %w", matrix[i].name, err)
			}
			fmt.Fprintf(os.Stderr, "round %d  %-40s %9.0f decisions/s\n", round, matrix[i].name, s.rate)
			samples[i] = append(samples[i], s)
		}
	}
	b.table(samples)
	fmt.Fprintln(out)
	return b.checks(ctx, samples)
}

func (b *bench) header() {
	model := "unknown CPU"
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	var uts syscall.Utsname
	kernel := ""
	if syscall.Uname(&uts) == nil {
		kernel = utsString(uts.Release[:])
	}
	ver := "?"
	if info, err := b.info("server"); err == nil {
		ver = info["redis_version"]
	}
	fmt.Fprintf(b.out, "machine: %d CPUs, %s, Linux %s, %s, redis-server %s\n", runtime.NumCPU(), model, kernel, runtime.Version(), ver)
	fmt.Fprintf(b.out, "workload: takes of cost 1 over %d subjects, limit %d per %d ms window; %d rounds of %v, medians\n",
		b.o.subjects, limit, windowMS, b.o.rounds, b.o.duration)
	if b.o.sidecarArgs != "" {
		fmt.Fprintf(b.out, "quotad serve %s\n", b.o.sidecarArgs)
	}
	fmt.Fprintln(b.out)
}

func utsString(cs []int8) string {
	var sb strings.Builder
	for _, c := range cs {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

func (b *bench) startSidecar(ctx context.Context) error {
	b.socket = filepath.Join(b.dir, "quotad.sock")
	args := []string{"serve", "--socket", b.socket, "--redis-url", b.redis.URL(), "--log-level", "warn", "--key-prefix", "bench:"}
	args = append(args, strings.Fields(b.o.sidecarArgs)...)
	logf, err := os.Create(filepath.Join(b.dir, "quotad.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	b.sidecar = exec.Command(b.o.quotad, args...)
	b.sidecar.Stdout, b.sidecar.Stderr = logf, logf
	if err := b.sidecar.Start(); err != nil {
		return fmt.Errorf("start quotad: %w", err)
	}
	b.exited = make(chan struct{})
	go func() { _ = b.sidecar.Wait(); close(b.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := b.ping(ctx); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(b.dir, "quotad.log"))
			return fmt.Errorf("quotad did not answer a ping with redis up: %w\n%s", err, log)
		}
		select {
		case <-b.exited:
			log, _ := os.ReadFile(filepath.Join(b.dir, "quotad.log"))
			return fmt.Errorf("quotad exited:\n%s", log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (b *bench) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := protocol.Dial(ctx, b.socket)
	if err != nil {
		return err
	}
	defer c.Close()
	r, _, err := c.Call(ctx, map[string]any{"op": "ping"})
	if err != nil {
		return err
	}
	if !r.RedisOK {
		return errors.New("redis not up yet")
	}
	return nil
}

func (b *bench) stopSidecar() {
	_ = b.sidecar.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(15 * time.Second):
		_ = b.sidecar.Process.Kill()
		<-b.exited
	}
}

// measure runs one row once on an empty Redis.
func (b *bench) measure(ctx context.Context, r row, round int) (sample, error) {
	var s sample
	if err := b.do(ctx, "FLUSHALL", "SYNC"); err != nil {
		return s, err
	}
	if err := b.do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		return s, err
	}
	spid, rpid := b.sidecar.Process.Pid, b.redis.Pid()
	sc0, err1 := cpuTime(spid)
	rc0, err2 := cpuTime(rpid)
	cc0, err3 := cpuTime(os.Getpid())
	if err := errors.Join(err1, err2, err3); err != nil {
		return s, err
	}

	// Count the measured client's Redis connections halfway through.
	connsDone := make(chan int, 1)
	go func() {
		time.Sleep(b.o.duration / 2)
		connsDone <- b.redisConns(ctx, !r.sidecar)
	}()
	var decisions int64
	prefix := "r" + strconv.Itoa(round) + "-"
	if r.sidecar {
		res, err := loadgen.Run(ctx, loadgen.Config{
			Socket: b.socket, Conns: r.conns, InFlight: r.inflight, Duration: b.o.duration,
			Subjects: b.o.subjects, SubjectPrefix: prefix, Limit: limit, WindowMS: windowMS,
			RequestIDs: r.requestIDs,
		})
		if err != nil {
			return s, err
		}
		decisions, s.rate, s.p50, s.p99, s.errors = res.Replies, res.Rate(), res.P50, res.P99, res.ErrorCount()
		s.errorCodes = res.Errors
	} else {
		res, err := b.baseline(ctx, r.conns, prefix)
		if err != nil {
			return s, err
		}
		decisions, s.rate, s.p50, s.p99, s.errors = res.decisions, res.rate, res.p50, res.p99, res.errors
	}
	s.redisConns = <-connsDone
	sc1, err1 := cpuTime(spid)
	rc1, err2 := cpuTime(rpid)
	cc1, err3 := cpuTime(os.Getpid())
	if err := errors.Join(err1, err2, err3); err != nil {
		return s, err
	}
	if decisions == 0 {
		return s, errors.New("no decision was made")
	}
	perDecision := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(decisions) }
	s.decisions = decisions
	s.sidecarCPU, s.redisCPU, s.clientCPU = perDecision(sc1-sc0), perDecision(rc1-rc0), perDecision(cc1-cc0)
	s.sidecarRSS, _ = rssBytes(spid)
	stats, err := b.commandStats(ctx)
	if err != nil {
		return s, err
	}
	var calls int64
	for name, st := range stats {
		switch name {
		case "evalsha", "eval":
			s.scriptUsec = max(s.scriptUsec, st.usecPerCall)
		case "flushall", "config", "info", "client", "ping", "script":
			continue // the harness's own commands
		}
		calls += st.calls
	}
	s.redisCalls = float64(calls) / float64(decisions)
	return s, nil
}

type baselineResult struct {
	decisions, errors int64
	rate              float64
	p50, p99          time.Duration
}

// baseline is the in-process client the issue compares quotad with: one
// rueidis client with default options, each goroutine calling the original
// script one decision at a time, so rueidis's auto-pipelining batches them.
func (b *bench) baseline(ctx context.Context, goroutines int, prefix string) (baselineResult, error) {
	var res baselineResult
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{b.redis.Addr()}, DisableCache: true, ClientName: "bench-baseline",
	})
	if err != nil {
		return res, fmt.Errorf("connect the in-process client: %w", err)
	}
	defer c.Close()
	script := rueidis.NewLuaScript(originalSrc)
	// Load the script once, so no goroutine pays for the first EVAL.
	if err := script.Exec(ctx, c, []string{"bench:warm:{x}"}, []string{"w", "1", "1", "1000"}).Error(); err != nil {
		return res, fmt.Errorf("original script: %w", err)
	}
	var errCount atomic.Int64
	var firstErr atomic.Pointer[error]
	lats := make([][]time.Duration, goroutines)
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(b.o.duration)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := uint64(g)*0x9e3779b97f4a7c15 + uint64(start.UnixNano())
			id := "g" + strconv.Itoa(g) + "-"
			var n int64
			lim, win := strconv.Itoa(limit), strconv.Itoa(windowMS)
			for ; time.Now().Before(deadline); n++ {
				rng ^= rng << 13
				rng ^= rng >> 7
				rng ^= rng << 17
				key := "bench:" + prefix + "{" + strconv.FormatUint(rng%uint64(b.o.subjects), 10) + "}"
				t0 := time.Now()
				err := script.Exec(ctx, c, []string{key}, []string{id + strconv.FormatInt(n, 36), "1", lim, win}).Error()
				if n%16 == 0 {
					lats[g] = append(lats[g], time.Since(t0))
				}
				if err != nil {
					errCount.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				}
			}
			done.Add(n)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) > 0 {
		res.p50, res.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	res.decisions, res.errors = done.Load(), errCount.Load()
	res.rate = float64(res.decisions) / elapsed.Seconds()
	if p := firstErr.Load(); p != nil && res.errors*100 > res.decisions {
		return res, fmt.Errorf("%d of %d calls failed, first: %w", res.errors, res.decisions, *p)
	}
	return res, nil
}

func (b *bench) do(ctx context.Context, args ...string) error {
	return b.ctl.Do(ctx, b.ctl.B().Arbitrary(args...).Build()).Error()
}

// info returns one INFO section as a map.
func (b *bench) info(section string) (map[string]string, error) {
	s, err := b.ctl.Do(context.Background(), b.ctl.B().Info().Section(section).Build()).ToString()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(s, "\r\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

type cmdStat struct {
	calls       int64
	usecPerCall float64
}

func (b *bench) commandStats(ctx context.Context) (map[string]cmdStat, error) {
	m, err := b.info("commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]cmdStat{}
	for k, v := range m {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(v, ",") {
			f, val, _ := strings.Cut(kv, "=")
			switch f {
			case "calls":
				st.calls, _ = strconv.ParseInt(val, 10, 64)
			case "usec_per_call":
				st.usecPerCall, _ = strconv.ParseFloat(val, 64)
			}
		}
		out[name] = st
	}
	return out, nil
}

// redisConns counts the measured client's connections: the baseline's by
// its name, quotad's as those with no name (the harness names its own).
func (b *bench) redisConns(ctx context.Context, baseline bool) int {
	s, err := b.ctl.Do(ctx, b.ctl.B().ClientList().Build()).ToString()
	if err != nil {
		return -1
	}
	n := 0
	for _, l := range strings.Split(s, "\n") {
		if l == "" {
			continue
		}
		named := strings.Contains(l, " name=bench-")
		switch {
		case baseline && strings.Contains(l, " name=bench-baseline "):
			n++
		case !baseline && !named:
			n++
		}
	}
	return n
}
