package integration_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// TestBenchCommandDrivesARealSidecar runs `quotad bench` briefly: the
// decisions it counts are ones Redis recorded, and denials show up once the
// few subjects run out. It measures nothing; make bench does.
func TestBenchCommandDrivesARealSidecar(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	stdout, stderr, code := sc.cli(t, "bench", "--duration", "300ms", "--conns", "2", "--inflight", "4",
		"--subjects", "3", "--subject-prefix", "b-", "--limit", "5", "--window-ms", "60000", "--request-ids")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "2 connections x 4 in flight") {
		t.Errorf("stderr does not describe the run: %q", stderr)
	}
	num := func(name string) int64 {
		t.Helper()
		m := regexp.MustCompile(`\b` + name + ` (\d+)`).FindStringSubmatch(stdout)
		if m == nil {
			t.Fatalf("no %q count in\n%s", name, stdout)
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		return n
	}
	// Three subjects with a limit of 5 accept exactly 15 takes of cost 1.
	if allowed, denied, errs := num("allowed"), num("denied"), num("error"); allowed != 15 || denied == 0 || errs != 0 {
		t.Fatalf("allowed %d denied %d error %d, want 15, some and 0\n%s", allowed, denied, errs, stdout)
	}
	for _, s := range []string{"b-0", "b-1", "b-2"} {
		if used := redisString(t, r, "HGET", sc.prefix+"fw:{i:"+s+"}", "used"); used != "5" {
			t.Errorf("subject %s: used %q in Redis, want 5", s, used)
		}
	}
	if !strings.Contains(stdout, "decisions/s") || !strings.Contains(stdout, "p99.9") {
		t.Errorf("no rate or latency in\n%s", stdout)
	}
}

// The other algorithms' inline limits come from their own flags: a token
// bucket of burst 4 on one subject accepts its burst, and concurrency
// leases released after each take never run out.
func TestBenchCommandDrivesEveryAlgorithm(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	failed := regexp.MustCompile(`\berror [1-9]`)
	for _, tc := range []struct {
		args []string
		want *regexp.Regexp
	}{
		{[]string{"--algorithm", "token_bucket", "--rate", "1", "--period-ms", "3600000", "--burst", "4"}, regexp.MustCompile(`\ballowed 4\b`)},
		{[]string{"--algorithm", "concurrency", "--limit", "2", "--lease-ms", "60000", "--request-ids", "--release"}, regexp.MustCompile(`\bdenied 0\b`)},
		{[]string{"--algorithm", "sliding_window", "--limit", "3"}, regexp.MustCompile(`\ballowed 3\b`)},
		{[]string{"--algorithm", "calendar", "--limit", "2", "--period", "day", "--time-zone", "Asia/Shanghai"}, regexp.MustCompile(`\ballowed 2\b`)},
	} {
		args := append([]string{"bench", "--duration", "200ms", "--conns", "1", "--inflight", "1", "--subjects", "1",
			"--subject-prefix", "a-" + tc.args[1] + "-"}, tc.args...)
		stdout, stderr, code := sc.cli(t, args[0], args[1:]...)
		if code != 0 || !tc.want.MatchString(stdout) || failed.MatchString(stdout) {
			t.Errorf("bench %v: exit %d, want %v\nstdout: %s\nstderr: %s", tc.args, code, tc.want, stdout, stderr)
		}
	}
}

func TestBenchCommandNeedsASidecar(t *testing.T) {
	t.Parallel()
	_, stderr, code := cli(t, "bench", "--socket", socketPath(t), "--duration", "100ms")
	if code != 1 || !strings.Contains(stderr, "connect") {
		t.Fatalf("exit %d, stderr %q; want 1 and a connect error", code, stderr)
	}
}
