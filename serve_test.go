package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
		{[]string{"--rls-socket", filepath.Join(dir, "rls.sock")}, "--rls-config is required"},
		{[]string{"--rls-addr", "127.0.0.1:0"}, "--rls-config is required"},
		{[]string{"--rls-config", badConfig}, "--rls-config needs --rls-socket or --rls-addr"},
		{[]string{"--rls-addr", "127.0.0.1:0", "--rls-config", filepath.Join(dir, "missing.yaml")}, "--rls-config"},
		{[]string{"--rls-addr", "127.0.0.1:0", "--rls-config", badConfig}, "--rls-config"},
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

func TestServeRejectsBadOpsSettings(t *testing.T) {
	dir, err := os.MkdirTemp("", "qo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-decisions", "some"}, "--log-decisions"},
		{[]string{"--http-addr", taken.Addr().String()}, "--http-addr"},
	} {
		args := append([]string{"serve", "--socket", filepath.Join(dir, "q.sock"), "--log-level", "error"}, tc.args...)
		_, stderr, code := runCLI(t, args...)
		if code != exitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("serve %v: code %d, stderr %q; want exit 1 naming %s", tc.args, code, stderr, tc.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "q.sock")); err == nil {
			t.Errorf("serve %v left its socket behind", tc.args)
		}
	}
}
