package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

var quotadBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "quotad-faultbench-test")
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

// TestEveryFaultKeepsTheInvariants runs every scenario once and fails on
// any violation of what quotad promises under a fault: no subject over its
// limit, exact replays, takes answered "not run" not run, a TTL on every
// key. The figures are not checked: they measure availability, which
// varies on a loaded machine.
func TestEveryFaultKeepsTheInvariants(t *testing.T) {
	var out bytes.Buffer
	o := options{
		quotad: quotadBin, runs: 1, latencies: []int{150}, timeout: defaultTimeout,
		conns: 8, inflight: 8, subjects: 100, limit: 20,
	}
	if err := run(t.Context(), &o, &out); err != nil {
		t.Fatalf("faultbench: %v\n%s", err, out.String())
	}
	t.Logf("\n%s", out.String())
	for _, sc := range []string{"latency150", "fresh", "flush", "blackhole"} {
		if !strings.Contains(out.String(), "## "+sc+":") {
			t.Errorf("scenario %s did not run", sc)
		}
	}
	if n := strings.Count(out.String(), "invariants hold"); n != 4 || strings.Contains(out.String(), "VIOLATION") {
		t.Errorf("%d of 4 runs kept the invariants", n)
	}
}
