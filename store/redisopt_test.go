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
		{"bad scheme", StoreOptions{RedisURL: "http://u:" + secret + "@h:1"}, `--redis-url http://xxxxx@h:1: unknown scheme "http"`},
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

// A --redis-url that cannot work gets a message about that URL, word for
// word, and never the password.
func TestRedisURLMessages(t *testing.T) {
	pw := "u:" + secret
	for _, tc := range []struct{ url, want string }{
		{"127.0.0.1:6379", "--redis-url 127.0.0.1:6379: no scheme: did you mean redis://127.0.0.1:6379?"},
		{"localhost:6379", "--redis-url localhost:6379: no scheme: did you mean redis://localhost:6379?"},
		{"redis-master", "--redis-url redis-master: no scheme: did you mean redis://redis-master?"},
		{pw + "@h:6379", "--redis-url xxxxx@h:6379: no scheme: did you mean redis://xxxxx@h:6379?"},
		{"/run/redis.sock", "--redis-url /run/redis.sock: no scheme: write unix:///run/redis.sock for a Unix socket"},
		{"redis:h:6379", "--redis-url redis:h:6379: redis: must be followed by //, as in redis://h:6379"},
		{"http://h:6379", `--redis-url http://h:6379: unknown scheme "http": want redis://, rediss:// (TLS) or unix:// (a socket); Cluster and Sentinel use redis:// or rediss:// too`},
		{"redis://h:notaport", `--redis-url redis://h:notaport: port "notaport" is not a number`},
		{"redis://" + pw + "@h:notaport", `--redis-url redis://xxxxx@h:notaport: port "notaport" is not a number`},
		{"redis://h:99999", "--redis-url redis://h:99999: port 99999 is out of range (1 to 65535)"},
		{"redis://", "--redis-url redis://: no host: write redis://host:6379 (redis://localhost:6379 for this machine)"},
		{"rediss://" + pw + "@", "--redis-url rediss://xxxxx@: no host: write redis://host:6379 (redis://localhost:6379 for this machine)"},
		{"redis://:6379", "--redis-url redis://:6379: no host before :6379"},
		{"redis://::1:6379", `--redis-url redis://::1:6379: host "::1": write an IPv6 address in brackets, as in redis://[::1]:6379`},
		{"redis://[::1:6379", `--redis-url redis://[::1:6379: host "[::1:6379": an IPv6 address needs its closing ]`},
		{"redis://u:pa/" + secret + "@h:6379", "--redis-url redis://xxxxx@h:6379: the user name or password holds / ? or #: percent-encode them (%2F, %3F, %23)"},
		{"redis://u:pa?" + secret + "@h:6379", "--redis-url redis://xxxxx@h:6379: the user name or password holds / ? or #: percent-encode them (%2F, %3F, %23)"},
		{"redis://u:pa#" + secret + "@h:6379", "--redis-url redis://xxxxx@h:6379: the user name or password holds / ? or #: percent-encode them (%2F, %3F, %23)"},
		{"redis://u:100%" + secret + "@h:6379", "--redis-url redis://xxxxx@h:6379: the user name or password holds a % that starts no percent-escape: write % as %25"},
		{"redis://u:a b" + secret + "@h:6379", "--redis-url redis://xxxxx@h:6379: the user name or password holds a character that must be percent-encoded (a space, \" < > [ ] ^ ` { | } or a control character)"},
		{"redis://" + pw + "@%zz:6379", `--redis-url redis://xxxxx@%zz:6379: host "%zz" is not a host name or address`},
		{"redis://h:6379/zero", `--redis-url redis://h:6379/zero: database "zero" is not a number: redis://host:6379/2 selects database 2`},
		{"redis://" + pw + "@h:6379/0/1", `--redis-url redis://u:xxxxx@h:6379/0/1: path "/0/1": only a database number may follow the host, as in redis://host:6379/2`},
		{"redis://h1:6379?addr=h2:x", `--redis-url redis://h1:6379?addr=h2%3Ax: addr=h2:x: port "x" is not a number`},
		{"redis://h:6379?db=x&sentinel_password=" + secret, `--redis-url redis://h:6379?db=x&sentinel_password=xxxxx: invalid database number: "x"`},
		{"unix://run/redis.sock", "--redis-url unix://run/redis.sock: the socket path must be absolute, after three slashes: unix:///run/redis.sock"},
		{"unix://", "--redis-url unix://: no socket path: write unix:///path/to/redis.sock"},
	} {
		_, err := redisClientOption(StoreOptions{RedisURL: tc.url})
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s:\n got %v\nwant %s", tc.url, err, tc.want)
		}
	}
	// What works keeps working.
	for _, ok := range []string{
		"redis://h:6379", "redis://h", "rediss://" + pw + "@h:6379/2", "redis://[::1]:6379", "unix:///run/redis.sock",
		"redis://u:p%40ss@h:6379", "redis://u:p@ss@h:6379", "redis://quotad@h:6379",
		"redis://h1:6379?addr=h2:6379&addr=[::1]:6380", "redis://s1:26379?master_set=m&sentinel_password=p@ss",
		"valkey://h:6379", "REDIS://h:6379",
	} {
		if _, err := redisClientOption(StoreOptions{RedisURL: ok}); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}
