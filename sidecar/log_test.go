package sidecar

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/store"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// Durations in JSON lines are numbers a log pipeline compares without
// parsing a unit; on the console they stay readable.
func TestLogDurationsAreNumbersInJSON(t *testing.T) {
	for _, tc := range []struct {
		format string
		field  zap.Field
		want   string
	}{
		{"json", zap.Duration(keyBackoff, 1500*time.Millisecond), `"backoff":1.5`},
		{"json", zap.Duration(keyTimeout, time.Second), `"redis_timeout":1`},
		{"console", zap.Duration(keyBackoff, 1500*time.Millisecond), `"backoff": "1.5s"`},
	} {
		var enc zapcore.Encoder
		if tc.format == "json" {
			enc = zapcore.NewJSONEncoder(encoderConfig(tc.format))
		} else {
			// The console encoder writes the fields as JSON after the message.
			enc = zapcore.NewConsoleEncoder(encoderConfig(tc.format))
		}
		buf, err := enc.EncodeEntry(zapcore.Entry{Message: "m", Time: time.Now()}, []zap.Field{tc.field})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%s: %q does not hold %s", tc.format, buf.String(), tc.want)
		}
	}
}

// A policy file without policies is worth a warning at start (and at
// every reload: package policy tests that): it answers inline limits only.
func TestEmptyPolicyFileIsWarnedOf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.yaml")
	if err := os.WriteFile(path, []byte("policies: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := policy.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenStore(store.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	core, logs := observer.New(zapcore.WarnLevel)
	srv := NewServer(Options{Store: st, Config: cfg, Logger: zap.New(core)})
	defer srv.Close()
	srv.LogStart(StartInfo{ConfigPath: path})
	if n := logs.FilterMessage(policy.NoPoliciesWarning).FilterField(zap.String(keyConfig, path)).Len(); n != 1 {
		t.Fatalf("start with no policies: %d warnings, want 1 (logs %v)", n, logs.All())
	}

	// Without a file no warning: inline limits are all there is by design.
	core2, logs2 := observer.New(zapcore.WarnLevel)
	srv2 := NewServer(Options{Store: st, Logger: zap.New(core2)})
	defer srv2.Close()
	srv2.LogStart(StartInfo{})
	if n := logs2.FilterMessage(policy.NoPoliciesWarning).Len(); n != 0 {
		t.Fatalf("start without --config: %d no-policies warnings, want 0", n)
	}
}

// On the embedded store the first lines say where the socket is, that
// quotas live in this process only, and give a take to paste; the take
// they give is one the server accepts.
func TestEmbeddedStoreStartLines(t *testing.T) {
	st := openStore(t, "")
	<-st.Started()
	core, logs := observer.New(zapcore.DebugLevel)
	ts := startServer(t, Options{Store: st, AllowInline: true, Logger: zap.New(core)})
	ts.LogStart(StartInfo{Socket: ts.sock})
	var msgs []string
	for _, e := range logs.All() {
		if e.LoggerName == "server" {
			msgs = append(msgs, e.Message)
		}
	}
	if len(msgs) != 3 || msgs[0] != "quotad started" || !strings.HasPrefix(msgs[1], "NO REDIS CONFIGURED: ") ||
		!strings.Contains(msgs[1], "QUOTAD_REDIS_URL") || !strings.HasPrefix(msgs[2], "try a take: echo '") ||
		!strings.HasSuffix(msgs[2], "' | nc -N -U "+ts.sock) {
		t.Fatalf("start lines %q; want quotad started, the embedded-store warning, and a take to try on %s", msgs, ts.sock)
	}
	if got := logs.FilterMessage("quotad started").All()[0].ContextMap()[keySocket]; got != ts.sock {
		t.Fatalf("quotad started names socket %v, want %s", got, ts.sock)
	}
	line := strings.TrimPrefix(msgs[2], "try a take: echo '")
	line = line[:strings.Index(line, "'")]
	if got := ts.dial(t).call(line); !got.OK || !got.Allowed {
		t.Fatalf("the take to try, %s, got %+v; want allowed", line, got)
	}

	// A path a shell would split or expand is quoted.
	for path, want := range map[string]string{
		"./quotad.sock":        "./quotad.sock",
		"/run/my quotad.sock":  "'/run/my quotad.sock'",
		"/tmp/it's$HOME.sock":  `'/tmp/it'\''s$HOME.sock'`,
		"/run/quotad/q-1.sock": "/run/quotad/q-1.sock",
	} {
		if got := tryTake(path); !strings.HasSuffix(got, "nc -N -U "+want) {
			t.Errorf("tryTake(%q) = %s; want it to end with %s", path, got, want)
		}
	}
}

// With a real Redis there is no embedded-store warning and no take to try.
func TestRedisStoreStartLines(t *testing.T) {
	r := redistest.Start(t)
	core, logs := observer.New(zapcore.DebugLevel)
	ts := startServer(t, Options{Store: openStore(t, r.URL()), Logger: zap.New(core)})
	ts.LogStart(StartInfo{Socket: ts.sock, RedisURL: r.URL()})
	if n := logs.Len(); n != 1 || logs.All()[0].Message != "quotad started" {
		t.Fatalf("start lines %v; want quotad started only", logs.All())
	}
}
