package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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
	out, _, code := runCLI(t, "version")
	if code != exitOK || strings.TrimSpace(out) != version {
		t.Fatalf("version: code %d, out %q", code, out)
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
	} {
		args := append([]string{"bench", "--socket", "/nonexistent/q.sock", "--quiet"}, tc.args...)
		_, stderr, code := runCLI(t, args...)
		if code != exitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("bench %v: code %d, stderr %q; want exit 1 mentioning %q", tc.args, code, stderr, tc.want)
		}
	}
}
