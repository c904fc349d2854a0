package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

const secret = "s3cr3t-Pw"

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRedisPasswordSources(t *testing.T) {
	tests := []struct {
		name string
		opts StoreOptions
		want string
	}{
		{"url", StoreOptions{RedisURL: "redis://u:" + secret + "@h:1"}, secret},
		{"env", StoreOptions{RedisURL: "redis://h:1", Password: secret}, secret},
		{"file with newline", StoreOptions{RedisURL: "redis://h:1", PasswordFile: writeFile(t, "pw", secret+"\n")}, secret},
		{"file with CRLF", StoreOptions{RedisURL: "redis://h:1", PasswordFile: writeFile(t, "pw", secret+"\r\n")}, secret},
		{"file without newline", StoreOptions{RedisURL: "redis://h:1", PasswordFile: writeFile(t, "pw", secret)}, secret},
		{"none", StoreOptions{RedisURL: "redis://h:1"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			copt, err := redisClientOption(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if copt.Password != tt.want {
				t.Fatalf("password %q, want %q", copt.Password, tt.want)
			}
		})
	}
}

func TestRedisOptionErrorsAreClearAndHideThePassword(t *testing.T) {
	ca := writeFile(t, "ca.pem", "not a certificate")
	tests := []struct {
		name string
		opts StoreOptions
		want string
	}{
		{"url and env", StoreOptions{RedisURL: "redis://u:" + secret + "@h:1", Password: secret}, "redis password given by the URL and QUOTAD_REDIS_PASSWORD: give it once"},
		{"env and file", StoreOptions{RedisURL: "redis://h:1", Password: secret, PasswordFile: writeFile(t, "pw", secret)}, "QUOTAD_REDIS_PASSWORD and --redis-password-file"},
		{"empty file", StoreOptions{RedisURL: "redis://h:1", PasswordFile: writeFile(t, "pw", "\n")}, "the file is empty"},
		{"missing file", StoreOptions{RedisURL: "redis://h:1", PasswordFile: "/nonexistent/pw"}, "--redis-password-file: open /nonexistent/pw"},
		{"ca without tls", StoreOptions{RedisURL: "redis://u:" + secret + "@h:1", CAFile: ca}, "needs a rediss:// URL"},
		{"ca not pem", StoreOptions{RedisURL: "rediss://u:" + secret + "@h:1", CAFile: ca}, "no PEM certificate in the file"},
		{"ca missing", StoreOptions{RedisURL: "rediss://h:1", CAFile: "/nonexistent/ca.pem"}, "--redis-ca-file: open /nonexistent/ca.pem"},
		{"bad scheme", StoreOptions{RedisURL: "http://u:" + secret + "@h:1"}, "parse --redis-url http://u:xxxxx@h:1: redis: invalid URL scheme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := redisClientOption(tt.opts)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not say %q", err, tt.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error %q shows the password", err)
			}
		})
	}
}

func TestRedisSentinelOptionFromURL(t *testing.T) {
	copt, err := redisClientOption(StoreOptions{
		RedisURL: "rediss://:" + secret + "@s1:26379?addr=s2:26379&master_set=main&sentinel_password=sp",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(copt.InitAddress, ","); got != "s1:26379,s2:26379" {
		t.Fatalf("addresses %s, want the two sentinels", got)
	}
	s := copt.Sentinel
	if s.MasterSet != "main" || s.Password != "sp" || copt.Password != secret || s.TLSConfig == nil || s.TopologyRefreshInterval <= 0 {
		t.Fatalf("sentinel option %+v (master password %q): want master set main, sentinel password sp, TLS and topology refresh", s, copt.Password)
	}
	if copt.ClientName != clientName || s.ClientName != clientName {
		t.Fatalf("client names %q, %q; want %q", copt.ClientName, s.ClientName, clientName)
	}
	if red := RedactURL("redis://:" + secret + "@s1:26379?master_set=main&sentinel_password=" + secret); strings.Contains(red, secret) {
		t.Fatalf("RedactURL shows a password: %s", red)
	}
}

// A request refused for want of a connection was not run, whatever the
// last connection attempt failed with: its reply must not call the outcome
// unknown.
func TestNotConnectedIsNotATimeout(t *testing.T) {
	st := &Store{kind: StoreRedis, log: zap.NewNop()}
	st.setUp(false, false, context.DeadlineExceeded)
	_, err := st.Client()
	if !errors.Is(err, ErrNotConnected) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Client() = %v: want ErrNotConnected and not a deadline", err)
	}
	if !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Fatalf("Client() = %v: want the cause in the message", err)
	}
	st.setUp(true, true, nil)
	if st.LastError() != nil {
		t.Fatalf("LastError() = %v after redis came up", st.LastError())
	}
}
