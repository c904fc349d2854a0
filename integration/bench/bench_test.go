package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var quotadBin string

func TestMain(m *testing.M) {
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
	var out bytes.Buffer
	err := run(context.Background(), options{
		quotad: quotadBin, duration: 300 * time.Millisecond, rounds: 2, subjects: 100,
		idleConns: 20, floodConns: 2, floodFor: 200 * time.Millisecond,
	}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"machine:", "2 rounds",
		matrix[0].name, matrix[1].name, matrix[2].name, matrix[3].name, matrix[4].name,
		"pipelining, quotad vs in-process", "one at a time, quotad vs in-process",
		"quotad CPU per decision", "Redis connections", "usec_per_call",
		"RSS added by 20 idle connections", "2 clients that never read", "exhausted subject",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
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
