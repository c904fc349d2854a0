package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var quotadBin string

func TestMain(m *testing.M) {
	floorMain()
	dir, err := os.MkdirTemp("", "quotad-bench-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	quotadBin = filepath.Join(dir, "quotad")
	out, err := exec.Command("go", "build", "-o", quotadBin, "quotad").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build quotad: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := 0
	func() {
		defer os.RemoveAll(dir)
		// goleak's check, without its os.Exit, so the binary is removed.
		code = m.Run()
		if code == 0 {
			if err := goleak.Find(); err != nil {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				code = 1
			}
		}
	}()
	os.Exit(code)
}

// TestBenchRunsEveryStep runs the whole of make bench with tiny durations:
// every row and check must produce its line. The figures are not checked;
// on a loaded machine they mean nothing at this scale.
func TestBenchRunsEveryStep(t *testing.T) {
	out := runBench(t, options{quotad: quotadBin, duration: 100 * time.Millisecond, rounds: 1})
	want := []string{
		"machine:", "main build: " + quotadBin, "1 rounds", "tracing rows: the main build exporting spans", "tracing rows: the receiver got",
		"pipelining, quotad vs in-process", "one at a time, quotad vs in-process",
		"quotad CPU per decision", "Redis connections", "usec_per_call", "Redis CPU per decision",
		"dec/script call", "RSS added by 20 idle connections", "2 clients that never read", "exhausted subject",
		"pipelining with request ids, quotad vs in-process", "decisions per script call", "probe p99",
		"PING p99 of another Redis client", "token bucket, 64x16 vs fixed window", "sliding window, 64x16 vs fixed window",
		"rls rows: the main build with --rls-socket", "RLS vs socket decisions/s, 2 descriptors, 64x16", "RLS vs socket decisions/s, 2 descriptors, 16x1",
		"quotad CPU per request, RLS vs socket, 64x16", "quotad CPU per request, RLS vs socket, 16x1",
		"gRPC floor CPU per call vs socket request, 64x16", "quotad CPU per RLS request above the floor vs socket, 16x1",
	}
	for _, r := range matrix {
		if r.reference {
			// Measured only with -envoy-ratelimit.
			if strings.Contains(out, r.name) {
				t.Errorf("output has %q without -envoy-ratelimit", r.name)
			}
			continue
		}
		want = append(want, r.name)
	}
	wantLines(t, out, want)
	if strings.Contains(out, "envoyproxy/ratelimit") {
		t.Errorf("a run without -envoy-ratelimit mentions it:\n%s", out)
	}
	// The tracing rows' sidecars exported: 100% of a row's decisions
	// were sampled.
	if !regexp.MustCompile(`tracing rows: the receiver got [1-9][0-9]* spans`).MatchString(out) {
		t.Errorf("the tracing rows exported no span:\n%s", out)
	}
	if strings.Contains(out, "baseline") {
		t.Errorf("a run without -baseline mentions one:\n%s", out)
	}
	// Every lease the take+release rows release was granted a moment
	// before and lives a minute.
	if strings.Contains(out, string(freedNothing)) {
		t.Errorf("a release found no lease to free:\n%s", out)
	}
}

// TestBenchComparesABaselineBuild measures the same binary as both builds:
// each must get its table and checks, and every quotad row its comparison.
func TestBenchComparesABaselineBuild(t *testing.T) {
	out := runBench(t, options{quotad: quotadBin, baseline: quotadBin, duration: 60 * time.Millisecond, rounds: 2})
	_, comparison, ok := strings.Cut(out, "main build against the baseline build")
	if !ok {
		t.Fatalf("no comparison table:\n%s", out)
	}
	comparison, _, _ = strings.Cut(comparison, "\n\n")
	want := []string{"decisions/s, main against baseline", "rounds' changes"}
	mainTable, _, _ := strings.Cut(out, "baseline build, ")
	for _, r := range matrix {
		switch {
		case r.reference:
			// Measured only with -envoy-ratelimit.
		case r.mainOnly:
			// Measured on the main build alone: in its table, not compared.
			if !strings.Contains(mainTable, r.name) || strings.Contains(comparison, r.name) {
				t.Errorf("the main-only row %q: want it in the main build's table and not in the comparison", r.name)
			}
		case r.sidecar:
			want = append(want, r.name)
		case strings.Contains(comparison, r.name):
			t.Errorf("the comparison has the in-process row %q", r.name)
		}
	}
	wantLines(t, comparison, want)
	wantLines(t, out, []string{
		"main build: " + quotadBin, "baseline build: " + quotadBin, "baseline build, " + quotadBin + ":",
		"main: pipelining, quotad vs in-process", "baseline: pipelining, quotad vs in-process",
		"main: Redis calls per take on an exhausted subject", "baseline: Redis calls per take on an exhausted subject",
	})
}

// TestBenchMeasuresOnlyTheRowsAsked: with -rows, the rows it matches are
// measured beside the four the targets compare with, and the others, with
// the targets that read them, are left out rather than shown as zero.
func TestBenchMeasuresOnlyTheRowsAsked(t *testing.T) {
	out := runBench(t, options{quotad: quotadBin, baseline: quotadBin, duration: 60 * time.Millisecond, rounds: 1, rows: "^token bucket, 64x16$"})
	wantLines(t, out, []string{
		"those matching ^token bucket, 64x16$",
		matrix[rowPipelining].name, matrix[rowInProcPipe].name, matrix[rowOneAtATime].name, matrix[rowInProcOne].name,
		matrix[rowTokenBucket].name, "token bucket, 64x16 vs fixed window", "pipelining, quotad vs in-process",
	})
	for i, r := range matrix {
		if i > rowInProcOne && i != rowTokenBucket && strings.Contains(out, r.name) {
			t.Errorf("output has the row %q, which -rows does not match:\n%s", r.name, out)
		}
	}
	for _, line := range []string{"pipelining with request ids", "sliding window", "rls rows", "RLS vs socket"} {
		if strings.Contains(out, line) {
			t.Errorf("output has %q, of a row not measured:\n%s", line, out)
		}
	}
	var none bytes.Buffer
	if err := run(context.Background(), options{quotad: quotadBin, rows: "("}, &none); err == nil || !strings.Contains(err.Error(), "rows") {
		t.Errorf("-rows ( = %v, want an error naming rows", err)
	}
}

func TestPairedRatiosAreOfTheSameRound(t *testing.T) {
	main := []sample{{rate: 110}, {rate: 90}, {rate: 300}}
	base := []sample{{rate: 100}, {rate: 100}, {rate: 200}, {rate: 50}}
	if got := pairedRatio(main, base, rate); math.Abs(got-1.1) > 1e-9 {
		t.Errorf("pairedRatio = %v, want 1.1, the median of 1.1, 0.9 and 1.5", got)
	}
	if lo, hi := pairedRange(main, base, rate); math.Abs(lo-0.9) > 1e-9 || math.Abs(hi-1.5) > 1e-9 {
		t.Errorf("pairedRange = %v, %v; want 0.9, 1.5", lo, hi)
	}
	// A round the baseline has no figure for counts for neither.
	base[1].rate = 0
	if lo, hi := pairedRange(main, base, rate); math.Abs(lo-1.1) > 1e-9 || math.Abs(hi-1.5) > 1e-9 {
		t.Errorf("pairedRange without round 2 = %v, %v; want 1.1, 1.5", lo, hi)
	}
}

func TestBenchRefusesAMissingBaseline(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), options{quotad: quotadBin, baseline: filepath.Join(t.TempDir(), "none"), rounds: 1}, &out)
	if err == nil || !strings.Contains(err.Error(), "none") {
		t.Fatalf("err = %v, want the missing baseline binary named", err)
	}
}

func TestBenchRefusesAMissingEnvoyRatelimit(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), options{quotad: quotadBin, ratelimit: filepath.Join(t.TempDir(), "no-ratelimit"), rounds: 1}, &out)
	if err == nil || !strings.Contains(err.Error(), "no-ratelimit") {
		t.Fatalf("err = %v, want the missing envoyproxy/ratelimit binary named", err)
	}
}

func runBench(t *testing.T, o options) string {
	t.Helper()
	o.subjects, o.idleConns, o.floodConns, o.floodFor = 100, 20, 2, 200*time.Millisecond
	var out bytes.Buffer
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return out.String()
}

func wantLines(t *testing.T, out string, want []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestCPUTimeAndRSSOfThisProcess(t *testing.T) {
	// Spin until the kernel has counted a tick of CPU, or give up after 10s.
	var cpu time.Duration
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		if cpu, err = cpuTime(os.Getpid()); err != nil || cpu > 0 {
			break
		}
	}
	if err != nil || cpu <= 0 {
		t.Fatalf("cpuTime = %v, %v; want the CPU this test just used", cpu, err)
	}
	rss, err := rssBytes(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("rssBytes = %d, %v; want at least a megabyte", rss, err)
	}
	if _, err := cpuTime(-1); err == nil {
		t.Fatal("cpuTime of no process did not fail")
	}
}

// TestBenchRLSRows: BENCH_ROWS=rls measures the rate limit service's rows
// and their socket twins, and prints their targets; every call was
// answered.
func TestBenchRLSRows(t *testing.T) {
	out := runBench(t, options{quotad: quotadBin, duration: 100 * time.Millisecond, rounds: 1, rows: "rls"})
	want := []string{"those matching rls", "RLS vs socket decisions/s, 2 descriptors, 64x16", "quotad CPU per request, RLS vs socket, 16x1"}
	for _, name := range []string{rowRLSSocketPipe, rowRLSPipe, rowRLSSocketOne, rowRLSOne} {
		want = append(want, name)
	}
	wantLines(t, out, want)
	if strings.Contains(out, "error replies of rls") {
		t.Errorf("an rls row got error replies:\n%s", out)
	}
	for i, r := range matrix {
		if i > rowInProcOne && !strings.HasPrefix(r.name, "rls: ") && strings.Contains(out, r.name) {
			t.Errorf("output has the row %q, which rls does not match", r.name)
		}
	}
}
