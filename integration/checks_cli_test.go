package integration_test

import (
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// quotad take --check, once per limit: all or nothing from a shell, with
// the exit codes of a take of one limit.
func TestCLITakeOfSeveralChecks(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	user := `{"subject":"user:42","limit":2,"window_ms":60000}`
	tenant := `{"subject": "tenant:7", "limit": 3, "window_ms": 60000, "cost": 2}`
	take := func(extra ...string) (reply, string, int) {
		t.Helper()
		stdout, stderr, code := sc.cli(t, "take", append([]string{"--check", user, "--check", tenant}, extra...)...)
		return mustParse(t, stdout), stderr, code
	}
	rep, stderr, code := take("-r", "req-1")
	if code != 0 || stderr != "" || !rep.flag(t, "allowed") {
		t.Fatalf("first take: exit %d, stderr %q, %s", code, stderr, rep)
	}
	checks, _ := rep.fields["checks"].([]any)
	if len(checks) != 2 {
		t.Fatalf("first take %s: want two checks", rep)
	}
	if rep, _, _ = take("-r", "req-1"); !rep.flag(t, "replay") {
		t.Fatalf("retry %s: want a replay", rep)
	}
	// The tenant has 1 left: denied, exit 2 with --exit-code, nothing used.
	rep, _, code = take("--exit-code")
	if code != 2 || rep.flag(t, "allowed") {
		t.Fatalf("take past the tenant's limit: exit %d, %s; want 2 and a denial", code, rep)
	}
	stdout, _, _ := sc.cli(t, "peek", "--limit", "2", "--window-ms", "60000", "user:42")
	if p := mustParse(t, stdout); p.num(t, "used") != 1 {
		t.Fatalf("the user's window after the denied take: %s, want used 1", p)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--check", "user:42"}, "not a JSON object"},
		{[]string{"--check", user, "--policy", "api"}, "not both"},
		{[]string{"--check", user, "alice"}, "unexpected arguments"},
		{[]string{"--check", user, "--check", user}, "same limit and subject"},
	} {
		_, stderr, code := sc.cli(t, "take", tc.args...)
		if code != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("take %v: exit %d, stderr %q; want 1 and %q", tc.args, code, stderr, tc.want)
		}
	}
}
