package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runCLI drives the command line in process, as main does.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), append([]string{"quotad"}, args...), &out, &errb)
	code = exitCode(err, &errb)
	return out.String(), errb.String(), code
}

func TestVersion(t *testing.T) {
	defer func(c string) { commit = c }(commit)
	commit = "abc1234"
	out, _, code := runCLI(t, "version")
	want := "quotad " + version + " (commit abc1234, " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if code != exitOK || out != want {
		t.Fatalf("version: code %d, out %q; want %q", code, out, want)
	}
	out, _, code = runCLI(t, "version", "--json")
	var b buildInfo
	if err := json.Unmarshal([]byte(out), &b); err != nil || code != exitOK {
		t.Fatalf("version --json: code %d, %v, out %q", code, err, out)
	}
	if b != (buildInfo{Version: version, Commit: "abc1234", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}) {
		t.Fatalf("version --json = %+v", b)
	}
	out, _, code = runCLI(t, "--version")
	if code != exitOK || !strings.Contains(out, "commit abc1234") {
		t.Fatalf("--version: code %d, out %q; want the commit", code, out)
	}
	// Unstamped, the commit comes from the build's VCS information, which a
	// test binary does not have.
	commit = ""
	out, _, _ = runCLI(t, "version", "--json")
	if err := json.Unmarshal([]byte(out), &b); err != nil || b.Commit != "unknown" {
		t.Fatalf("unstamped version --json = %q (%v); want commit unknown", out, err)
	}
}

// Mistakes an operator can make are refused at start with a message that
// names the flag, before anything listens.
func TestServeRejectsBadSettings(t *testing.T) {
	dir, err := os.MkdirTemp("", "qm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "q.sock")
	badConfig := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badConfig, []byte("policies:\n  api:\n    limit: 0\n    window: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--socket-mode", "rw"}, "--socket-mode"},
		{[]string{"--key-prefix", "a{b}:"}, "--key-prefix"},
		{[]string{"--config", badConfig}, `policy "api": limit`},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, "--config"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--redis-timeout", "0s"}, "--redis-timeout"},
		{[]string{"--config-poll", "0s"}, "--config-poll"},
		{[]string{"--redis-flush-delay", "-1us"}, "--redis-flush-delay"},
		{[]string{"--redis-flush-delay", "2ms"}, "--redis-flush-delay"},
		{[]string{"--idle-timeout", "-1s"}, "--idle-timeout"},
		{[]string{"--max-conns-per-peer", "-1"}, "--max-conns-per-peer"},
		{[]string{"--redis-url", "redis://user:hunter2@%zz:6379"}, "--redis-url"},
		{[]string{"--socket", filepath.Join(dir, "nodir", "q.sock")}, "directory"},
		{[]string{"--socket", "/tmp/" + strings.Repeat("x", 120)}, "at most 107"},
		{[]string{"--procs", "-1"}, "--procs"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
	} {
		args := append([]string{"serve", "--socket", sock, "--log-level", "error"}, tc.args...)
		_, stderr, code := runCLI(t, args...)
		if code != exitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("serve %v: code %d, stderr %q; want exit 1 mentioning %q", tc.args, code, stderr, tc.want)
		}
		if strings.Contains(stderr, "hunter2") {
			t.Errorf("serve %v: the password appears in %q", tc.args, stderr)
		}
	}
}

func TestClientCommandsNeedASubjectAndASidecar(t *testing.T) {
	_, stderr, code := runCLI(t, "take", "--socket", "/nonexistent/q.sock", "--limit", "1", "--window-ms", "1000")
	if code != exitError || !strings.Contains(stderr, "subject") {
		t.Fatalf("take without subject: code %d, stderr %q", code, stderr)
	}
	_, stderr, code = runCLI(t, "ping", "--socket", "/nonexistent/q.sock")
	if code != exitError || !strings.Contains(stderr, "connect to quotad") {
		t.Fatalf("ping without sidecar: code %d, stderr %q", code, stderr)
	}
}

// Flags after the subject are not parsed; dropping them silently would turn
// a denial into exit 0 for `take ... subject --exit-code`.
func TestClientCommandsRefuseArgumentsAfterTheSubject(t *testing.T) {
	for _, args := range [][]string{
		{"take", "--limit", "1", "--window-ms", "1000", "bob", "--exit-code"},
		{"take", "--limit", "1", "--window-ms", "1000", "alice", "bob"},
		{"peek", "--subject", "alice", "--limit", "1", "--window-ms", "1000", "bob"},
	} {
		_, stderr, code := runCLI(t, append(args[:1:1], append([]string{"--socket", "/nonexistent/q.sock"}, args[1:]...)...)...)
		if code != exitError || !strings.Contains(stderr, "unexpected arguments") {
			t.Errorf("%v: code %d, stderr %q; want exit 1 naming the unexpected arguments", args, code, stderr)
		}
	}
}

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

// serve and doctor read the same Redis flags and env vars, and refuse a bad
// one with the same words.
func TestRedisFlagsAreShared(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "q.sock")
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"QUOTAD_REDIS_URL": "127.0.0.1:6379"}, nil, "--redis-url 127.0.0.1:6379: no scheme: did you mean redis://127.0.0.1:6379?"},
		{nil, []string{"--redis-url", "redis://h:notaport"}, `--redis-url redis://h:notaport: port "notaport" is not a number`},
		{map[string]string{"QUOTAD_REDIS_URL": "redis://h:1", "QUOTAD_REDIS_CA_FILE": "/nonexistent/ca.pem"}, nil, "--redis-ca-file /nonexistent/ca.pem: needs a rediss:// URL"},
		{map[string]string{"QUOTAD_REDIS_URL": "redis://u:hunter2@h:1", "QUOTAD_REDIS_PASSWORD": "hunter2"}, nil, "redis password given by the URL and QUOTAD_REDIS_PASSWORD"},
		{map[string]string{"QUOTAD_REDIS_URL": "redis://h:1", "QUOTAD_REDIS_PASSWORD_FILE": "/nonexistent/pw"}, nil, "--redis-password-file: open /nonexistent/pw"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		for _, cmd := range [][]string{{"serve", "--socket", sock, "--log-level", "error"}, {"doctor"}} {
			_, stderr, code := runCLI(t, append(cmd, tc.args...)...)
			if code != exitError || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "hunter2") {
				t.Errorf("%s %v with %v: code %d, stderr %q; want exit 1 saying %q", cmd[0], tc.args, tc.env, code, stderr, tc.want)
			}
		}
		for k := range tc.env {
			os.Unsetenv(k)
		}
	}
	_, stderr, code := runCLI(t, "doctor", "--default-ttl", "0s", "--redis-url", "redis://h:1")
	if code != exitError || !strings.Contains(stderr, "--default-ttl must be at least 1ms") {
		t.Errorf("doctor --default-ttl 0s: code %d, stderr %q", code, stderr)
	}
}
