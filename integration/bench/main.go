// Command bench is `make bench`: it starts a private redis-server, a quotad
// sidecar on it (and a second, baseline build with -baseline), and an
// in-process rueidis client running the design documents' original quota
// script on the same Redis, then measures them in alternating rounds and
// prints one table per build and, with a baseline, the change of every row.
// It asserts nothing; the figures are for people, and the checks print "ok"
// or "FAIL" beside their targets.
//
// Knobs (flags, or the environment variables make bench passes):
// BENCH_DURATION per measurement, BENCH_ROUNDS, BENCH_SIDECAR_ARGS extra
// `quotad serve` flags for trying tuning options (given to both builds),
// BASELINE the second binary, BENCH_ENVOY_RATELIMIT a build of
// envoyproxy/ratelimit's server (src/service_cmd) measured beside quotad's
// rate limit service on the same Redis.
package main

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"quotad/integration/otlptest"
	"quotad/integration/redistest"
	"quotad/loadgen"
	"quotad/protocol"
)

//go:embed original.lua
var originalSrc string

// The workload every row runs: takes of cost 1 spread over subjects at
// random, with a limit no row reaches within a measurement, so that every
// decision is a full read-check-write. The token bucket holds and refills
// as many tokens per window as the fixed window allows; a concurrency take
// acquires a lease of its own, which outlives the measurement unless the
// row releases it.
const (
	limit    = 10_000 // the original script's largest limit
	windowMS = 60_000
)

type options struct {
	quotad      string
	baseline    string
	duration    time.Duration
	rounds      int
	subjects    int
	idleConns   int
	floodConns  int
	floodFor    time.Duration
	sidecarArgs string
	rows        string // a regular expression: the quotad rows measured
	// ratelimit is envoyproxy/ratelimit's server binary; "" leaves its
	// rows out.
	ratelimit string
}

func main() {
	floorMain()
	var o options
	flag.StringVar(&o.quotad, "quotad", "bin/quotad", "quotad binary to measure")
	flag.StringVar(&o.baseline, "baseline", os.Getenv("BASELINE"), "a second quotad binary measured in the same run, its rounds alternating with -quotad's (BASELINE)")
	flag.DurationVar(&o.duration, "duration", envDuration("BENCH_DURATION", 5*time.Second), "length of each measurement (BENCH_DURATION)")
	flag.IntVar(&o.rounds, "rounds", envInt("BENCH_ROUNDS", 3), "rounds of the matrix; the table shows medians (BENCH_ROUNDS)")
	flag.IntVar(&o.subjects, "subjects", 10_000, "distinct subjects")
	flag.IntVar(&o.idleConns, "idle-conns", 2000, "connections of the idle-memory check")
	flag.IntVar(&o.floodConns, "flood-conns", 100, "connections of the flood check")
	flag.DurationVar(&o.floodFor, "flood-duration", 5*time.Second, "length of the flood check")
	flag.StringVar(&o.sidecarArgs, "sidecar-args", os.Getenv("BENCH_SIDECAR_ARGS"), "extra flags for quotad serve, of both builds (BENCH_SIDECAR_ARGS)")
	flag.StringVar(&o.ratelimit, "envoy-ratelimit", os.Getenv("BENCH_ENVOY_RATELIMIT"), "envoyproxy/ratelimit's server (go install github.com/envoyproxy/ratelimit/src/service_cmd@latest), measured beside quotad's rate limit service on the same Redis (BENCH_ENVOY_RATELIMIT)")
	flag.StringVar(&o.rows, "rows", os.Getenv("BENCH_ROWS"), "a regular expression: measure only the rows whose name it matches, beside the four the targets compare with (BENCH_ROWS)")
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
	algorithm  string // of a quotad row
	conns      int    // socket connections, or goroutines in process
	inflight   int
	requestIDs bool
	release    bool // concurrency: release every lease once its take is answered
	inProcess  int  // index of the in-process row this one is compared with; -1 for none
	// mainOnly: only the main build is measured (an algorithm a baseline
	// build may not know).
	mainOnly bool
	// tracing is the sampling ratio of a sidecar that exports spans over
	// OTLP gRPC to a receiver of the bench's (parentbased_traceidratio:
	// the takes carry no trace context, so the ratio decides); 0 measures
	// the sidecar without tracing.
	tracing float64
	// checks makes every take a take of that many checks; rls sends
	// ShouldRateLimit calls of rlsKeys' descriptors to Envoy's rate limit
	// service instead, conns streams (HTTP/2 connections) of inflight
	// calls each. Both run on the main build's sidecar with the service
	// on, so that the two paths to the same decisions compare in one
	// process.
	checks int
	rls    bool
	// reference: an rls row served by envoyproxy/ratelimit (-envoy-ratelimit)
	// on the same Redis instead of quotad; floor: by the gRPC floor
	// (floor.go), a server with quotad's gRPC options that decides nothing.
	reference, floor bool
	// period of a calendar row; "" is a day.
	period string
	// The allotment rows' (allotment.go): policy names a policy of the
	// sidecar started with allotmentPolicies, which measures the row;
	// subjects, when not 0, replaces -subjects; minRounds, when more than
	// -rounds, measures the row in that many rounds.
	policy    string
	subjects  int
	minRounds int
}

// The rows the checks read.
const (
	rowPipelining = 0 // fixed window, 64 conns x 16
	rowInProcPipe = 1
	rowOneAtATime = 2 // fixed window, 16 conns x 1
	rowInProcOne  = 3
)

// Every quotad row is compared with the in-process client of the same
// shape, which runs the original fixed-window script with a request id on
// every call. A concurrency take always has a request id: it names the
// lease. A take+release row counts the replies to both as decisions.
var matrix = []row{
	{name: "quotad, pipelining 64 conns x 16", sidecar: true, algorithm: "fixed_window", conns: 64, inflight: 16, inProcess: rowInProcPipe},
	{name: "in-process, 1024 goroutines", conns: 1024, inflight: 1, inProcess: -1},
	{name: "quotad, one at a time 16 conns x 1", sidecar: true, algorithm: "fixed_window", conns: 16, inflight: 1, inProcess: rowInProcOne},
	{name: "in-process, 16 goroutines", conns: 16, inflight: 1, inProcess: -1},
	{name: "quotad, pipelining 64x16, request ids", sidecar: true, algorithm: "fixed_window", conns: 64, inflight: 16, requestIDs: true, inProcess: rowInProcPipe},
	{name: "quotad, one at a time 16x1, request ids", sidecar: true, algorithm: "fixed_window", conns: 16, inflight: 1, requestIDs: true, inProcess: rowInProcOne},
	{name: "token bucket, 64x16", sidecar: true, algorithm: "token_bucket", conns: 64, inflight: 16, inProcess: rowInProcPipe},
	{name: "token bucket, 64x16, request ids", sidecar: true, algorithm: "token_bucket", conns: 64, inflight: 16, requestIDs: true, inProcess: rowInProcPipe},
	{name: "token bucket, 16x1", sidecar: true, algorithm: "token_bucket", conns: 16, inflight: 1, inProcess: rowInProcOne},
	{name: "token bucket, 16x1, request ids", sidecar: true, algorithm: "token_bucket", conns: 16, inflight: 1, requestIDs: true, inProcess: rowInProcOne},
	{name: "concurrency take, 64x16, request ids", sidecar: true, algorithm: "concurrency", conns: 64, inflight: 16, requestIDs: true, inProcess: rowInProcPipe},
	{name: "concurrency take, 16x1, request ids", sidecar: true, algorithm: "concurrency", conns: 16, inflight: 1, requestIDs: true, inProcess: rowInProcOne},
	{name: "concurrency take+release, 64x16", sidecar: true, algorithm: "concurrency", conns: 64, inflight: 16, requestIDs: true, release: true, inProcess: rowInProcPipe},
	{name: "concurrency take+release, 16x1", sidecar: true, algorithm: "concurrency", conns: 16, inflight: 1, requestIDs: true, release: true, inProcess: rowInProcOne},
	{name: "sliding window, 64x16", sidecar: true, algorithm: "sliding_window", conns: 64, inflight: 16, inProcess: rowInProcPipe, mainOnly: true},
	{name: "sliding window, 64x16, request ids", sidecar: true, algorithm: "sliding_window", conns: 64, inflight: 16, requestIDs: true, inProcess: rowInProcPipe, mainOnly: true},
	{name: "calendar (day), 64x16", sidecar: true, algorithm: "calendar", conns: 64, inflight: 16, inProcess: rowInProcPipe, mainOnly: true},
	{name: "calendar (day), 64x16, request ids", sidecar: true, algorithm: "calendar", conns: 64, inflight: 16, requestIDs: true, inProcess: rowInProcPipe, mainOnly: true},
	// Tracing on; the rows above are tracing off.
	{name: "quotad, pipelining 64x16, tracing 1%", sidecar: true, algorithm: "fixed_window", conns: 64, inflight: 16, inProcess: rowInProcPipe, mainOnly: true, tracing: 0.01},
	{name: "quotad, pipelining 64x16, tracing 100%", sidecar: true, algorithm: "fixed_window", conns: 64, inflight: 16, inProcess: rowInProcPipe, mainOnly: true, tracing: 1},
	{name: "quotad, one at a time 16x1, tracing 1%", sidecar: true, algorithm: "fixed_window", conns: 16, inflight: 1, inProcess: rowInProcOne, mainOnly: true, tracing: 0.01},
	{name: "quotad, one at a time 16x1, tracing 100%", sidecar: true, algorithm: "fixed_window", conns: 16, inflight: 1, inProcess: rowInProcOne, mainOnly: true, tracing: 1},
	// Envoy's rate limit service beside the socket doing the same: a
	// request of two descriptors, each matched to a limit of rlsConfig,
	// is one take of two checks of epoch-aligned minutes (a calendar
	// minute in UTC is one). A decision is a request, of either path.
	{name: rowRLSSocketPipe, sidecar: true, algorithm: "calendar", conns: 64, inflight: 16, checks: 2, period: "minute", inProcess: -1, mainOnly: true},
	{name: rowRLSPipe, sidecar: true, conns: 64, inflight: 16, rls: true, inProcess: -1, mainOnly: true},
	{name: rowRLSSocketOne, sidecar: true, algorithm: "calendar", conns: 16, inflight: 1, checks: 2, period: "minute", inProcess: -1, mainOnly: true},
	{name: rowRLSOne, sidecar: true, conns: 16, inflight: 1, rls: true, inProcess: -1, mainOnly: true},
	{name: rowFloorPipe, sidecar: true, conns: 64, inflight: 16, rls: true, floor: true, inProcess: -1, mainOnly: true},
	{name: rowFloorOne, sidecar: true, conns: 16, inflight: 1, rls: true, floor: true, inProcess: -1, mainOnly: true},
	{name: rowReferencePipe, sidecar: true, conns: 64, inflight: 16, rls: true, reference: true, inProcess: -1, mainOnly: true},
	{name: rowReferenceOne, sidecar: true, conns: 16, inflight: 1, rls: true, reference: true, inProcess: -1, mainOnly: true},
}

// The rate limit service's rows, which its targets compare in pairs.
const (
	rowRLSSocketPipe = "rls: socket, take of 2 checks, 64x16"
	rowRLSPipe       = "rls: ShouldRateLimit, 2 descriptors, 64 streams x 16"
	rowRLSSocketOne  = "rls: socket, take of 2 checks, 16x1"
	rowRLSOne        = "rls: ShouldRateLimit, 2 descriptors, 16 streams x 1"
	rowFloorPipe     = "rls: gRPC floor, a handler deciding nothing, 64 streams x 16"
	rowFloorOne      = "rls: gRPC floor, a handler deciding nothing, 16 streams x 1"
	rowReferencePipe = "rls: envoyproxy/ratelimit, 2 descriptors, 64 streams x 16"
	rowReferenceOne  = "rls: envoyproxy/ratelimit, 2 descriptors, 16 streams x 1"
)

// rowNamed is the index of the row of that name.
func rowNamed(name string) int {
	for i, r := range matrix {
		if r.name == name {
			return i
		}
	}
	panic("no row " + name)
}

// The rate limit service's descriptors: one per key, each limited as the
// socket rows' checks are.
const rlsDomain = "bench"

var rlsKeys = []string{"user", "tenant"}

func rlsConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", rlsDomain)
	for _, k := range rlsKeys {
		fmt.Fprintf(&b, "  - key: %s\n    rate_limit:\n      unit: minute\n      requests_per_unit: %d\n", k, limit)
	}
	return b.String()
}

// More rows the checks read.
const (
	rowPipeliningIDs = 4 // fixed window, 64 conns x 16, request ids
	rowTokenBucket   = 6 // token bucket, 64x16
	rowSliding       = 14
)

// sample is one measurement of one row.
type sample struct {
	rate        float64
	p50, p99    time.Duration
	errors      int64
	sidecarCPU  float64 // µs per decision
	redisCPU    float64
	clientCPU   float64
	scriptUsec  float64       // Redis's time per script call, of every script and flavour
	redisCalls  float64       // Redis commands per decision, the script and those it ran
	scriptCalls int64         // EVAL, EVALSHA and FCALL calls, of every flavour
	redisConns  int           // connections of the measured client to Redis
	probeP99    time.Duration // of a PING every ms from another client of the same Redis
	sidecarRSS  int64
	decisions   int64
	errorCodes  map[protocol.Code]int64 // quotad rows only
}

// decPerScript is the decisions each script call made.
func (s sample) decPerScript() float64 {
	if s.scriptCalls == 0 {
		return 0
	}
	return float64(s.decisions) / float64(s.scriptCalls)
}

// sidecar is one running quotad build.
type sidecar struct {
	label  string // "main" or "baseline"
	file   string // names its socket and log; label when empty
	env    []string
	args   []string // more quotad serve flags
	bin    string
	socket string
	// rlsSocket is the rate limit service's socket, when args turn it on.
	rlsSocket string
	log       string
	cmd       *exec.Cmd
	exited    chan struct{}
}

type bench struct {
	o        options
	rows     *regexp.Regexp // nil: every row
	out      io.Writer
	dir      string
	redis    *redistest.Server
	ctl      rueidis.Client
	sidecars []*sidecar // the main build first
	// traced are the sidecars of the tracing rows, by sampling ratio,
	// started at their first row; receiver gets their spans.
	traced   map[float64]*sidecar
	receiver *otlptest.Receiver
	// allotment is the sidecar of the allotment rows, with its policy
	// file, started at their first row.
	allotment *sidecar
	// rls is the main build's sidecar with the rate limit service on,
	// reference envoyproxy/ratelimit's server, and floor the gRPC
	// floor's, each started at its first row.
	rls, reference, floor *sidecar
}

func run(ctx context.Context, o options, out io.Writer) (err error) {
	var rows *regexp.Regexp
	if o.rows != "" {
		var err error
		if rows, err = regexp.Compile(o.rows); err != nil {
			return fmt.Errorf("rows: %w", err)
		}
	}
	bins := []string{o.quotad}
	if o.baseline != "" {
		bins = append(bins, o.baseline)
	}
	for _, bin := range bins {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("quotad binary: %w (run make build first)", err)
		}
	}
	if o.ratelimit != "" {
		if _, err := os.Stat(o.ratelimit); err != nil {
			return fmt.Errorf("envoyproxy/ratelimit binary: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "quotad-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b := &bench{o: o, out: out, dir: dir, rows: rows, traced: map[float64]*sidecar{}}
	defer func() {
		b.stopTraced()
		b.stopAllotment()
		if b.receiver != nil {
			b.receiver.Close()
		}
		for _, sc := range []*sidecar{b.rls, b.reference, b.floor} {
			if sc != nil {
				b.stopSidecar(sc)
			}
		}
	}()
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
	for i, bin := range bins {
		sc := &sidecar{label: "main", bin: bin}
		if i > 0 {
			sc.label = "baseline"
		}
		if err := b.startSidecar(ctx, sc); err != nil {
			return fmt.Errorf("%s build: %w", sc.label, err)
		}
		defer b.stopSidecar(sc)
		b.sidecars = append(b.sidecars, sc)
	}

	b.header()
	// samples[row][build]; an in-process row has one build.
	samples := make([][][]sample, len(matrix))
	for i, r := range matrix {
		samples[i] = make([][]sample, 1)
		if r.sidecar && !r.mainOnly {
			samples[i] = make([][]sample, len(b.sidecars))
		}
	}
	type unit struct{ row, build int }
	var units []unit
	for i := range matrix {
		if !b.measured(i) {
			continue
		}
		for k := range samples[i] {
			units = append(units, unit{i, k})
		}
	}
	rounds := o.rounds
	for _, u := range units {
		rounds = max(rounds, matrix[u.row].minRounds)
	}
	for round := 1; round <= rounds; round++ {
		// Alternate the order, so that no side always runs on a machine
		// warmed (or tired) by another: in even rounds the baseline build
		// runs each row before the main one.
		for n := range units {
			u := units[n]
			if round%2 == 0 {
				u = units[len(units)-1-n]
			}
			r := matrix[u.row]
			if round > max(o.rounds, r.minRounds) {
				continue
			}
			var sc *sidecar
			label := "in-process"
			if r.sidecar {
				sc = b.sidecars[u.build]
				label = sc.label
				if r.tracing > 0 {
					if sc, err = b.tracedSidecar(ctx, sc, r.tracing); err != nil {
						return fmt.Errorf("%s: %w", r.name, err)
					}
				}
				switch {
				case r.reference:
					if sc, err = b.referenceServer(ctx); err != nil {
						return fmt.Errorf("%s: %w", r.name, err)
					}
					label = "reference"
				case r.floor:
					if sc, err = b.floorServer(ctx); err != nil {
						return fmt.Errorf("%s: %w", r.name, err)
					}
					label = "floor"
				case r.rls || r.checks > 0:
					if sc, err = b.rlsSidecar(ctx, sc); err != nil {
						return fmt.Errorf("%s: %w", r.name, err)
					}
				case r.policy != "":
					if sc, err = b.allotmentSidecar(ctx, sc); err != nil {
						return fmt.Errorf("%s: %w", r.name, err)
					}
				}
			}
			s, err := b.measure(ctx, r, sc, round)
			if err != nil {
				return fmt.Errorf("%s (%s): %w", r.name, label, err)
			}
			fmt.Fprintf(os.Stderr, "round %d  %-10s %-42s %9.0f decisions/s\n", round, label, r.name, s.rate)
			samples[u.row][u.build] = append(samples[u.row][u.build], s)
		}
	}
	if b.receiver != nil {
		b.stopTraced()
		fmt.Fprintf(out, "tracing rows: the receiver got %d spans\n\n", b.receiver.Count())
	}
	for k, sc := range b.sidecars {
		if len(b.sidecars) > 1 {
			fmt.Fprintf(out, "%s build, %s:\n", sc.label, sc.bin)
		}
		b.table(samples, k)
		fmt.Fprintln(out)
	}
	if len(b.sidecars) > 1 {
		b.compare(samples)
		fmt.Fprintln(out)
	}
	for k, sc := range b.sidecars {
		if err := b.checks(ctx, samples, k); err != nil {
			return fmt.Errorf("%s build: %w", sc.label, err)
		}
	}
	return nil
}

// measured says whether row i is measured: every row, or with -rows the
// rows it matches and the four the targets compare with; envoyproxy/
// ratelimit's only with its binary.
func (b *bench) measured(i int) bool {
	if matrix[i].reference && b.o.ratelimit == "" {
		return false
	}
	return b.rows == nil || i <= rowInProcOne || b.rows.MatchString(matrix[i].name)
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
	for _, sc := range b.sidecars {
		v, _ := exec.Command(sc.bin, "version").Output()
		fmt.Fprintf(b.out, "%s build: %s (%s)\n", sc.label, sc.bin, strings.TrimSpace(string(v)))
	}
	fmt.Fprintf(b.out, "workload: takes of cost 1 over %d subjects, limit %d per %d ms window (token bucket: rate and burst %d per %d ms; concurrency: %d leases of %d ms); %d rounds of %v, medians\n",
		b.o.subjects, limit, windowMS, limit, windowMS, limit, windowMS, b.o.rounds, b.o.duration)
	if b.o.sidecarArgs != "" {
		fmt.Fprintf(b.out, "quotad serve %s\n", b.o.sidecarArgs)
	}
	if b.rows != nil {
		fmt.Fprintf(b.out, "rows: the fixed window's and the in-process client's, and those matching %s\n", b.rows)
	}
	b.allotmentHeader()
	for i, r := range matrix {
		if r.tracing > 0 && b.measured(i) {
			fmt.Fprintln(b.out, "tracing rows: the main build exporting spans over OTLP gRPC to a receiver in this process, OTEL_TRACES_SAMPLER=parentbased_traceidratio with the row's ratio")
			break
		}
	}
	for i, r := range matrix {
		if r.rls && b.measured(i) {
			fmt.Fprintf(b.out, "rls rows: the main build with --rls-socket; ShouldRateLimit over the Unix socket with go-control-plane's client (in this process: see client CPU), descriptors %v of domain %s, each %d per minute; beside takes of as many checks of a calendar minute on the JSON socket, of the same sidecar\n", rlsKeys, rlsDomain, limit)
			if b.o.ratelimit != "" {
				fmt.Fprintf(b.out, "envoyproxy/ratelimit rows: %s on the same Redis with the same descriptors, its defaults otherwise (REDIS_POOL_SIZE 10, no pipeline window); its CPU in the quotad CPU column\n", b.o.ratelimit)
			}
			break
		}
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

// tracedSidecar is the sidecar of base's build that exports spans sampled
// at ratio, started the first time.
func (b *bench) tracedSidecar(ctx context.Context, base *sidecar, ratio float64) (*sidecar, error) {
	if sc := b.traced[ratio]; sc != nil {
		return sc, nil
	}
	if b.receiver == nil {
		var err error
		if b.receiver, err = otlptest.Launch(true); err != nil {
			return nil, fmt.Errorf("otlp receiver: %w", err)
		}
	}
	arg := strconv.FormatFloat(ratio, 'f', -1, 64)
	sc := &sidecar{label: base.label, bin: base.bin, file: base.label + "-tracing-" + arg, env: []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + b.receiver.GRPCEndpoint(), "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG=" + arg,
	}}
	if err := b.startSidecar(ctx, sc); err != nil {
		return nil, err
	}
	b.traced[ratio] = sc
	return sc, nil
}

// rlsSidecar is the sidecar of base's build serving Envoy's rate limit
// service on a second socket, started the first time.
func (b *bench) rlsSidecar(ctx context.Context, base *sidecar) (*sidecar, error) {
	if b.rls != nil {
		return b.rls, nil
	}
	file := base.label + "-rls"
	cfg := filepath.Join(b.dir, file+".yaml")
	if err := os.WriteFile(cfg, []byte(rlsConfig()), 0o644); err != nil {
		return nil, err
	}
	sc := &sidecar{label: base.label, bin: base.bin, file: file, rlsSocket: filepath.Join(b.dir, file+"-envoy.sock")}
	sc.args = []string{"--rls-socket", sc.rlsSocket, "--rls-config", cfg}
	if err := b.startSidecar(ctx, sc); err != nil {
		return nil, err
	}
	b.rls = sc
	return sc, nil
}

// referenceServer is envoyproxy/ratelimit's server on the same Redis,
// serving rlsConfig on a Unix socket, started the first time. Its statsd
// is off and its HTTP ports are free ones on the loopback.
func (b *bench) referenceServer(ctx context.Context) (*sidecar, error) {
	if b.reference != nil {
		return b.reference, nil
	}
	runtime := filepath.Join(b.dir, "ratelimit-runtime")
	cfgDir := filepath.Join(runtime, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), []byte(rlsConfig()), 0o644); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	sc := &sidecar{label: "reference", bin: b.o.ratelimit, file: "ratelimit", rlsSocket: filepath.Join(b.dir, "ratelimit.sock")}
	sc.log = filepath.Join(b.dir, "ratelimit.log")
	logf, err := os.Create(sc.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	sc.cmd = exec.Command(sc.bin)
	sc.cmd.Env = append(os.Environ(),
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+b.redis.Addr(), "CACHE_KEY_PREFIX=bench-reference:",
		"RUNTIME_ROOT="+runtime, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false",
		"GRPC_UDS="+sc.rlsSocket, "USE_STATSD=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "PORT="+ports[0], "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+ports[1], "GRPC_HOST=127.0.0.1", "GRPC_PORT="+ports[2],
	)
	sc.cmd.Stdout, sc.cmd.Stderr = logf, logf
	if err := sc.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start envoyproxy/ratelimit: %w", err)
	}
	sc.exited = make(chan struct{})
	go func() { _ = sc.cmd.Wait(); close(sc.exited) }()
	b.reference = sc
	if err := awaitRLS(ctx, sc, "envoyproxy/ratelimit"); err != nil {
		return nil, err
	}
	return sc, nil
}

// freePorts returns n loopback ports free a moment ago.
func freePorts(n int) ([]string, error) {
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		_, p, _ := net.SplitHostPort(l.Addr().String())
		ports = append(ports, p)
	}
	return ports, nil
}

// stopTraced stops the tracing rows' sidecars, which send their last
// spans as they exit.
func (b *bench) stopTraced() {
	for ratio, sc := range b.traced {
		b.stopSidecar(sc)
		delete(b.traced, ratio)
	}
}

func (b *bench) startSidecar(ctx context.Context, sc *sidecar) error {
	file := cmp.Or(sc.file, sc.label)
	sc.socket = filepath.Join(b.dir, file+".sock")
	sc.log = filepath.Join(b.dir, file+".log")
	args := []string{"serve", "--socket", sc.socket, "--redis-url", b.redis.URL(), "--log-level", "warn", "--key-prefix", "bench:"}
	args = append(args, sc.args...)
	args = append(args, strings.Fields(b.o.sidecarArgs)...)
	logf, err := os.Create(sc.log)
	if err != nil {
		return err
	}
	defer logf.Close()
	sc.cmd = exec.Command(sc.bin, args...)
	sc.cmd.Env = append(os.Environ(), sc.env...)
	sc.cmd.Stdout, sc.cmd.Stderr = logf, logf
	if err := sc.cmd.Start(); err != nil {
		return fmt.Errorf("start quotad: %w", err)
	}
	sc.exited = make(chan struct{})
	go func() { _ = sc.cmd.Wait(); close(sc.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := ping(ctx, sc.socket); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(sc.log)
			return fmt.Errorf("quotad did not answer a ping with redis up: %w\n%s", err, log)
		}
		select {
		case <-sc.exited:
			log, _ := os.ReadFile(sc.log)
			return fmt.Errorf("quotad exited:\n%s", log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ping(ctx context.Context, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := protocol.Dial(ctx, socket)
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

func (b *bench) stopSidecar(sc *sidecar) {
	_ = sc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-sc.exited:
	case <-time.After(15 * time.Second):
		_ = sc.cmd.Process.Kill()
		<-sc.exited
	}
}

// measure runs one row once on an empty Redis, against sc for a quotad row.
func (b *bench) measure(ctx context.Context, r row, sc *sidecar, round int) (sample, error) {
	var s sample
	if err := b.do(ctx, "FLUSHALL", "SYNC"); err != nil {
		return s, err
	}
	if err := b.do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		return s, err
	}
	spid, rpid := -1, b.redis.Pid()
	if sc != nil {
		spid = sc.cmd.Process.Pid
	}
	var sc0 time.Duration
	var err1 error
	if sc != nil {
		sc0, err1 = cpuTime(spid)
	}
	rc0, err2 := cpuTime(rpid)
	cc0, err3 := cpuTime(os.Getpid())
	if err := errors.Join(err1, err2, err3); err != nil {
		return s, err
	}

	// Another client of the same Redis, measuring what the load adds to
	// its latency.
	probeCtx, stopProbe := context.WithCancel(ctx)
	probeDone := make(chan probeResult, 1)
	go func() { probeDone <- probe(probeCtx, b.redis.Addr()) }()
	defer stopProbe()
	// Count the measured client's Redis connections halfway through.
	connsDone := make(chan int, 1)
	go func() {
		time.Sleep(b.o.duration / 2)
		connsDone <- b.redisConns(ctx, spid)
	}()
	var decisions int64
	prefix := "r" + strconv.Itoa(round) + "-"
	if sc != nil {
		cfg := loadgen.Config{
			Socket: sc.socket, Conns: r.conns, InFlight: r.inflight, Duration: b.o.duration,
			Subjects: cmp.Or(r.subjects, b.o.subjects), SubjectPrefix: prefix, RequestIDs: r.requestIDs, Checks: r.checks,
		}
		switch r.algorithm {
		case "token_bucket":
			cfg.Algorithm, cfg.Rate, cfg.PeriodMS = r.algorithm, limit, windowMS
		case "concurrency":
			cfg.Algorithm, cfg.Limit, cfg.LeaseMS, cfg.Release = r.algorithm, limit, windowMS, r.release
		case "sliding_window":
			cfg.Algorithm, cfg.Limit, cfg.WindowMS = r.algorithm, limit, windowMS
		case "calendar":
			// A day's limit: no row reaches it, whatever the hour. A
			// minute's (the rls rows') is not reached either: each
			// round has subjects of its own.
			cfg.Algorithm, cfg.Limit, cfg.Period = r.algorithm, limit, cmp.Or(r.period, "day")
		default:
			cfg.Limit, cfg.WindowMS = limit, windowMS
		}
		if r.policy != "" {
			cfg = policyLoad(cfg, r.policy)
		}
		var res loadgen.Result
		var err error
		if r.rls {
			res, err = loadgen.RunRLS(ctx, loadgen.RLSConfig{
				Socket: sc.rlsSocket, Streams: r.conns, InFlight: r.inflight, Duration: b.o.duration,
				Domain: rlsDomain, Keys: rlsKeys, Subjects: b.o.subjects, SubjectPrefix: prefix,
			})
		} else {
			res, err = loadgen.Run(ctx, cfg)
		}
		if r.policy != "" {
			settleAllotments()
		}
		if err != nil {
			<-connsDone
			return s, err
		}
		decisions, s.rate, s.p50, s.p99, s.errors = res.Replies, res.Rate(), res.P50, res.P99, res.ErrorCount()
		s.errorCodes = res.Errors
		if n := res.Releases - res.Released; n > 0 {
			// Every lease released was granted and is still live.
			s.errorCodes[freedNothing] += n
			s.errors += n
		}
		if res.Denied > 0 {
			<-connsDone
			return s, fmt.Errorf("%d of %d takes were denied: the workload must stay under its limits", res.Denied, res.Replies)
		}
	} else {
		res, err := b.inProcess(ctx, r.conns, prefix, r.subjects)
		if err != nil {
			<-connsDone
			return s, err
		}
		decisions, s.rate, s.p50, s.p99, s.errors = res.decisions, res.rate, res.p50, res.p99, res.errors
	}
	s.redisConns = <-connsDone
	stopProbe()
	pr := <-probeDone
	if pr.err != nil {
		return s, fmt.Errorf("latency probe: %w", pr.err)
	}
	s.probeP99 = pr.p99
	var sc1 time.Duration
	if sc != nil {
		sc1, err1 = cpuTime(spid)
	}
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
	if sc != nil {
		s.sidecarRSS, _ = rssBytes(spid)
	}
	stats, err := b.commandStats(ctx)
	if err != nil {
		return s, err
	}
	var calls, scriptUsec int64
	for name, st := range stats {
		switch name {
		case "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro":
			scriptUsec += st.usec
			s.scriptCalls += st.calls
		case "flushall", "config", "info", "client", "ping", "script":
			continue // the harness's own commands
		}
		calls += st.calls
	}
	s.redisCalls = float64(calls) / float64(decisions)
	if s.scriptCalls > 0 {
		s.scriptUsec = float64(scriptUsec) / float64(s.scriptCalls)
	}
	return s, nil
}

type inProcessResult struct {
	decisions, errors int64
	rate              float64
	p50, p99          time.Duration
}

// inProcess is the in-process client quotad is compared with: one rueidis
// client with default options, each goroutine calling the original script
// one decision at a time, so rueidis's auto-pipelining batches them.
// hotSubjects, when not 0, is the hot-key workload of the allotment rows
// (allotment.go): that many subjects, each moving on to a fresh key before
// the original script's largest limit is reached, so that none is denied.
func (b *bench) inProcess(ctx context.Context, goroutines int, prefix string, hotSubjects int) (inProcessResult, error) {
	var res inProcessResult
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{b.redis.Addr()}, DisableCache: true, ClientName: inProcessName,
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
	var hot *hotKeys
	if hotSubjects > 0 {
		hot = &hotKeys{subjects: hotSubjects}
	}
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
				var key string
				if hot != nil {
					key = hot.key(prefix, rng)
				} else {
					key = "bench:" + prefix + "{" + strconv.FormatUint(rng%uint64(b.o.subjects), 10) + "}"
				}
				t0 := time.Now()
				resp := script.Exec(ctx, c, []string{key}, []string{id + strconv.FormatInt(n, 36), "1", lim, win})
				err := resp.Error()
				if err == nil && hot != nil {
					err = notDenied(resp)
				}
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
	calls int64
	usec  int64 // all the calls' time
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
			case "usec":
				st.usec, _ = strconv.ParseInt(val, 10, 64)
			}
		}
		out[name] = st
	}
	return out, nil
}

// freedNothing counts, among a row's error replies, the releases that
// found no lease to free.
const freedNothing protocol.Code = "RELEASE_FREED_NOTHING"

// inProcessName is the in-process client's name in Redis's CLIENT LIST.
const inProcessName = "bench-inprocess"

// redisConns counts the measured client's connections to Redis: quotad's
// (pid) from its own open sockets, the in-process client's (pid -1) by its
// name.
func (b *bench) redisConns(ctx context.Context, pid int) int {
	if pid > 0 {
		_, port, _ := strings.Cut(b.redis.Addr(), ":")
		p, err := strconv.Atoi(port)
		if err != nil {
			return -1
		}
		n, err := tcpConnsTo(pid, p)
		if err != nil {
			return -1
		}
		return n
	}
	s, err := b.ctl.Do(ctx, b.ctl.B().ClientList().Build()).ToString()
	if err != nil {
		return -1
	}
	n := 0
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, " name="+inProcessName+" ") {
			n++
		}
	}
	return n
}

type probeResult struct {
	p99 time.Duration
	err error
}

// probe sends PING on a connection of its own to the Redis at addr every
// millisecond until ctx ends, and returns the 99th percentile of the
// round trips: the latency the measured load adds to Redis's other
// clients (a batch script call holds Redis while it runs).
func probe(ctx context.Context, addr string) probeResult {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return probeResult{err: err}
	}
	defer c.Close()
	go func() { <-ctx.Done(); _ = c.SetDeadline(time.Now()) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var lats []time.Duration
	buf := make([]byte, 7)
	for {
		select {
		case <-ctx.Done():
			if len(lats) == 0 {
				return probeResult{}
			}
			sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
			return probeResult{p99: lats[len(lats)*99/100]}
		case <-tick.C:
		}
		t0 := time.Now()
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			if ctx.Err() != nil {
				continue
			}
			return probeResult{err: err}
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			if ctx.Err() != nil {
				continue
			}
			return probeResult{err: err}
		}
		if string(buf) != "+PONG\r\n" {
			return probeResult{err: fmt.Errorf("PING answered %q", buf)}
		}
		lats = append(lats, time.Since(t0))
	}
}
