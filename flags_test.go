package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
