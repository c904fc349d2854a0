package main

import (
	"strings"
	"testing"
)

func TestBenchRejectsBadSettings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--conns", "0"}, "must be positive"},
		{[]string{"--inflight", "-1"}, "must be positive"},
		{[]string{"--duration", "0s"}, "must be positive"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--policy", "api", "--limit", "5"}, "not both"},
		{[]string{"--policy", "api", "--algorithm", "token_bucket"}, "not both"},
		{[]string{"--algorithm", "token_bucket", "--rate", "10"}, "rate and period_ms"},
		{[]string{"--algorithm", "calendar"}, "limit and a period"},
		{[]string{"--algorithm", "fixed_window", "--period", "day"}, "limit and window_ms"},
		{[]string{"--release", "--algorithm", "concurrency", "--lease-ms", "1000"}, "request ids"},
	} {
		args := append([]string{"bench", "--socket", "/nonexistent/q.sock", "--quiet"}, tc.args...)
		_, stderr, code := runCLI(t, args...)
		if code != exitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("bench %v: code %d, stderr %q; want exit 1 mentioning %q", tc.args, code, stderr, tc.want)
		}
	}
}
