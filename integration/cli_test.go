package integration_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// TestCLIDesignScenario walks the design scenario of PROTOCOL.md through the
// CLI, as an operator would from a shell: take, replay, fill, deny, a
// conflicting retry and a bad cost, with the exit codes scripts rely on.
func TestCLIDesignScenario(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())

	take := func(cost int, requestID string, extra ...string) (reply, string, int) {
		t.Helper()
		args := []string{"--limit", "5", "--window-ms", "60000", "--cost", strconv.Itoa(cost)}
		if requestID != "" {
			args = append(args, "-r", requestID)
		}
		args = append(append(args, extra...), "alice")
		stdout, stderr, code := sc.cli(t, "take", args...)
		return mustParse(t, stdout), stderr, code
	}

	rep, stderr, code := take(2, "order-1")
	if code != 0 || stderr != "" {
		t.Fatalf("order-1: exit %d, stderr %q; want 0 and nothing", code, stderr)
	}
	wantTake(t, rep, true, false, 5, 2)
	wantResetWithin(t, rep, 60000)

	rep, _, code = take(2, "order-1")
	if code != 0 {
		t.Fatalf("order-1 again: exit %d, want 0", code)
	}
	wantTake(t, rep, true, true, 5, 2)

	rep, _, code = take(3, "order-2")
	if code != 0 {
		t.Fatalf("order-2: exit %d, want 0", code)
	}
	wantTake(t, rep, true, false, 5, 5)

	// A denial is an answer: exit 0 unless the caller asks for exit 2.
	rep, stderr, code = take(1, "order-3")
	if code != 0 || stderr != "" {
		t.Fatalf("order-3: exit %d, stderr %q; want 0 and nothing", code, stderr)
	}
	wantTake(t, rep, false, false, 5, 5)
	rep, _, code = take(1, "order-3", "--exit-code")
	if code != 2 {
		t.Fatalf("order-3 with --exit-code: exit %d, want 2", code)
	}
	wantTake(t, rep, false, false, 5, 5)

	rep, stderr, code = take(1, "order-1")
	if code == 0 || !strings.Contains(stderr, "CONFLICT") {
		t.Fatalf("order-1 with cost 1: exit %d, stderr %q; want non-zero and CONFLICT", code, stderr)
	}
	wantError(t, rep, "CONFLICT")

	rep, stderr, code = take(-1, "")
	if code == 0 || !strings.Contains(stderr, "INVALID") {
		t.Fatalf("cost -1: exit %d, stderr %q; want non-zero and INVALID", code, stderr)
	}
	wantError(t, rep, "INVALID")

	stdout, _, code := sc.cli(t, "peek", "--limit", "5", "--window-ms", "60000", "alice")
	if code != 0 {
		t.Fatalf("peek: exit %d, want 0", code)
	}
	rep = mustParse(t, stdout)
	wantPeek(t, rep, 5, 5)
	wantResetWithin(t, rep, 60000)

	stdout, _, code = sc.cli(t, "ping")
	if code != 0 {
		t.Fatalf("ping: exit %d, want 0", code)
	}
	rep = mustParse(t, stdout)
	if !rep.ok() || rep.str(t, "store") != "redis" || !rep.flag(t, "redis_ok") {
		t.Fatalf("ping: got %s, want store redis and redis_ok", rep)
	}

	// QUOTAD_SOCKET stands in for --socket.
	stdout, _, code = cliEnv(t, []string{"QUOTAD_SOCKET=" + sc.socket}, "ping")
	if code != 0 || !mustParse(t, stdout).ok() {
		t.Fatalf("ping with QUOTAD_SOCKET: exit %d, stdout %q", code, stdout)
	}

	stdout, _, code = cli(t, "version")
	if code != 0 || strings.TrimSpace(stdout) == "" {
		t.Fatalf("version: exit %d, stdout %q; want 0 and a version", code, stdout)
	}

	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestCLISubjectsThatLookLikeCommands: a subject is data, even when it is
// spelled like a subcommand; "help" must not print help and exit 0, which a
// script would read as "allowed".
func TestCLISubjectsThatLookLikeCommands(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	for _, subject := range []string{"help", "h"} {
		for _, op := range []string{"take", "peek"} {
			stdout, stderr, code := sc.cli(t, op, "--limit", "1", "--window-ms", "60000", subject)
			if code != 0 {
				t.Fatalf("%s %s: exit %d, stderr %q", op, subject, code, stderr)
			}
			rep := mustParse(t, stdout)
			if rep.code() != "" || rep.num(t, "limit") != 1 {
				t.Fatalf("%s %s printed %q, want a reply for that subject", op, subject, stdout)
			}
		}
		stdout, _, code := sc.cli(t, "take", "--limit", "1", "--window-ms", "60000", "--exit-code", subject)
		if code != 2 {
			t.Fatalf("second take of %q with --exit-code: exit %d (%s), want 2: denied", subject, code, stdout)
		}
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestProcsDefaultsToOneAndYieldsToGOMAXPROCS checks how many threads run the
// sidecar's Go code, as its start line reports it: one by default, what
// --procs or QUOTAD_PROCS says, and what GOMAXPROCS says when neither is
// given.
func TestProcsDefaultsToOneAndYieldsToGOMAXPROCS(t *testing.T) {
	// The child inherits this process's environment and machine, so with
	// --procs 0 it runs as many as this test does.
	goDefault := float64(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want float64
	}{
		{name: "default", env: []string{"GOMAXPROCS="}, want: 1},
		{name: "flag", args: []string{"--procs", "3"}, want: 3},
		{name: "env", env: []string{"QUOTAD_PROCS=3"}, want: 3},
		{name: "GOMAXPROCS", env: []string{"GOMAXPROCS=3"}, want: 3},
		{name: "flag over GOMAXPROCS", env: []string{"GOMAXPROCS=3"}, args: []string{"--procs", "2"}, want: 2},
		{name: "zero keeps Go's default", args: []string{"--procs", "0"}, want: goDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := launchSidecarEnv(t, socketPath(t), "", tc.env, tc.args...)
			start := p.waitLog(t, "info", "quotad started")
			if got, _ := start["procs"].(float64); got != tc.want {
				t.Fatalf("procs = %v, want %v (start line %v)", start["procs"], tc.want, start)
			}
		})
	}
	_, stderr, code := cli(t, "serve", "--socket", socketPath(t), "--procs", "-1")
	if code == 0 || !strings.Contains(stderr, "--procs") {
		t.Fatalf("--procs -1: exit %d, stderr %q; want a refusal naming --procs", code, stderr)
	}
}
