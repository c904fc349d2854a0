package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// quotad check reads a policy file as serve does and reports every problem
// at once, with its line, for CI.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "policies:\n  api:\n    limit: 100\n    window: 1m\n  login:\n    limit: 5\n    window: 15m\n")
	out, stderr, code := runCLI(t, "check", "--config", good)
	if code != exitOK || out != "2 policies ok\n" || stderr != "" {
		t.Fatalf("check good: code %d, out %q, stderr %q; want 0 and \"2 policies ok\"", code, out, stderr)
	}
	// QUOTAD_CONFIG stands in for --config, as for serve.
	t.Setenv("QUOTAD_CONFIG", good)
	if out, _, code := runCLI(t, "check"); code != exitOK || out != "2 policies ok\n" {
		t.Fatalf("check with QUOTAD_CONFIG: code %d, out %q", code, out)
	}

	bad := write("bad.yaml", "policies:\n"+
		"  login:\n"+
		"    limit: 5\n"+
		"    windwo: 15m\n"+
		"  api:\n"+
		"    limit: 0\n"+
		"    window: 1m\n"+
		"  ok:\n"+
		"    limit: 1\n"+
		"    window: 1s\n"+
		"polices: {}\n")
	out, stderr, code = runCLI(t, "check", "--config", bad)
	want := bad + `:4: policy "login": unknown field "windwo" (did you mean "window"?)` + "\n" +
		bad + `:6: policy "api": limit: must be from 1 to 1000000000, got 0` + "\n" +
		bad + `:11: unknown top-level key "polices" (did you mean "policies"?)` + "\n" +
		"quotad: " + bad + ": 3 problems\n"
	if code != exitError || out != "" || stderr != want {
		t.Fatalf("check bad: code %d, out %q, stderr:\n%s\nwant exit 1 and:\n%s", code, out, stderr, want)
	}

	// serve refuses the same file with the same words.
	_, stderr, code = runCLI(t, "serve", "--socket", filepath.Join(dir, "q.sock"), "--config", bad)
	if code != exitError || !strings.Contains(stderr, `policy "login": unknown field "windwo" (did you mean "window"?)`) || !strings.Contains(stderr, `policy "api": limit`) {
		t.Fatalf("serve with the bad file: code %d, stderr %q", code, stderr)
	}

	// No policies is valid (inline limits need none), but said.
	for _, body := range []string{"", "# nothing yet\n", "policies:\n", "policies: {}\n"} {
		empty := write("empty.yaml", body)
		out, stderr, code = runCLI(t, "check", "--config", empty)
		if code != exitOK || out != "0 policies ok\n" || stderr != "quotad: warning: "+empty+": the policy file defines no policies: only inline limits can be taken\n" {
			t.Errorf("check %q: code %d, out %q, stderr %q; want 0 with a warning", body, code, out, stderr)
		}
	}
	one := write("one.yaml", "policies:\n  api:\n    limit: 1\n    window: 1s\n")
	if out, _, code := runCLI(t, "check", "--config", one); code != exitOK || out != "1 policy ok\n" {
		t.Errorf("check one: code %d, out %q", code, out)
	}

	t.Setenv("QUOTAD_CONFIG", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--config is required"},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, "--config: read config: open " + filepath.Join(dir, "missing.yaml")},
		{[]string{"--config", good, "extra"}, "unexpected arguments"},
		{[]string{"--config", write("list.yaml", "- api\n")}, ":1: the file must be a mapping with a policies: key"},
		{[]string{"--config", write("yaml.yaml", "policies: [\n")}, "parse yaml: "},
	} {
		_, stderr, code := runCLI(t, append([]string{"check"}, tc.args...)...)
		if code != exitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("check %v: code %d, stderr %q; want exit 1 mentioning %q", tc.args, code, stderr, tc.want)
		}
	}
}

// quotad check --rls-config reads envoyproxy/ratelimit's descriptors as
// serve does, a file or a directory, and with --config checks the
// quotad_policy names against the policy file.
func TestCheckRLS(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("rls/edge.yaml", "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	write("rls/api.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {quotad_policy: per-user}\n")
	rlsDir := filepath.Join(dir, "rls")
	out, stderr, code := runCLI(t, "check", "--rls-config", rlsDir)
	if code != exitOK || out != "2 rls domains ok\n" ||
		stderr != "quotad: warning: "+rlsDir+": quotad_policy not checked without --config: per-user\n" {
		t.Fatalf("check rls: code %d, out %q, stderr %q", code, out, stderr)
	}
	t.Setenv("QUOTAD_RLS_CONFIG", filepath.Join(rlsDir, "edge.yaml"))
	if out, stderr, code := runCLI(t, "check"); code != exitOK || out != "1 rls domain ok\n" || stderr != "" {
		t.Fatalf("check with QUOTAD_RLS_CONFIG: code %d, out %q, stderr %q", code, out, stderr)
	}
	t.Setenv("QUOTAD_RLS_CONFIG", "")

	policies := write("quotad.yaml", "policies:\n  per-user:\n    algorithm: token_bucket\n    rate: 10\n    period: 1s\n    burst: 20\n")
	if out, stderr, code := runCLI(t, "check", "--config", policies, "--rls-config", rlsDir); code != exitOK ||
		out != "1 policy ok\n2 rls domains ok\n" || stderr != "" {
		t.Fatalf("check both: code %d, out %q, stderr %q", code, out, stderr)
	}
	other := write("other.yaml", "policies:\n  api:\n    limit: 1\n    window: 1s\n")
	apiFile := filepath.Join(rlsDir, "api.yaml")
	out, stderr, code = runCLI(t, "check", "--config", other, "--rls-config", rlsDir)
	want := apiFile + `:4: domain "api": descriptors[0] (key "user") > rate_limit: quotad_policy: no policy "per-user" in the policy file` + "\n" +
		"quotad: " + rlsDir + ": 1 problem\n"
	if code != exitError || out != "1 policy ok\n" || stderr != want {
		t.Fatalf("check a missing policy: code %d, out %q, stderr:\n%s\nwant:\n%s", code, out, stderr, want)
	}

	bad := write("bad.yaml", "domain: edge\ndescriptors:\n"+
		"  - key: remote_address\n"+
		"    descriptors:\n"+
		"      - key: path\n"+
		"        rate_limit: {unit: fortnight, requests_per_unit: 1}\n"+
		"  - key: remote_address\n"+
		"    ratelimit: {}\n")
	out, stderr, code = runCLI(t, "check", "--rls-config", bad)
	want = bad + `:6: domain "edge": descriptors[0] (key "remote_address") > descriptors[0] (key "path") > rate_limit: unit: unknown unit "fortnight": one of second, minute, hour, day, week, month, year` + "\n" +
		bad + `:7: domain "edge": descriptors[1] (key "remote_address"): key "remote_address" without a value given twice at this level (first at line 3)` + "\n" +
		bad + `:8: domain "edge": descriptors[1] (key "remote_address"): unknown key "ratelimit"` + "\n" +
		"quotad: " + bad + ": 3 problems\n"
	if code != exitError || out != "" || stderr != want {
		t.Fatalf("check bad: code %d, out %q, stderr:\n%s\nwant:\n%s", code, out, stderr, want)
	}
	// A bad policy file stops before the descriptors are read.
	if _, stderr, code := runCLI(t, "check", "--config", write("list.yaml", "- x\n"), "--rls-config", rlsDir); code != exitError ||
		strings.Contains(stderr, "rls") {
		t.Fatalf("bad policy file: code %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runCLI(t, "check", "--rls-config", filepath.Join(dir, "missing")); code != exitError ||
		!strings.Contains(stderr, "--rls-config: read rls config: stat "+filepath.Join(dir, "missing")) {
		t.Fatalf("missing: code %d, stderr %q", code, stderr)
	}
}
