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
