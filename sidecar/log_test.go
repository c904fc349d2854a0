package sidecar

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		{"json", latencyField(1234567 * time.Nanosecond), `"latency_us":1234`},
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

// A policy file without policies is worth a warning at start and at every
// reload: it answers inline limits only.
func TestEmptyPolicyFileIsWarnedOf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.yaml")
	write := func(body string) {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("policies: {}\n")
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	store, err := OpenStore(StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	srv := NewServer(Options{Store: store, Config: cfg, Logger: zap.New(core)})
	warnings := func() int {
		return logs.FilterMessage(NoPoliciesWarning).FilterField(zap.String(keyConfig, path)).Len()
	}

	srv.LogStart(StartInfo{ConfigPath: path})
	if warnings() != 1 {
		t.Fatalf("start with no policies: %d warnings, want 1 (logs %v)", warnings(), logs.All())
	}
	r := NewReloader(path, time.Hour, srv, zap.New(core))
	write("policies:\n  api:\n    limit: 1\n    window: 1s\n")
	r.load(false)
	write("# emptied\n")
	r.load(false)
	if warnings() != 2 || len(srv.Config().Policies) != 0 {
		t.Fatalf("reload to no policies: %d warnings, %d policies; want 2 and 0", warnings(), len(srv.Config().Policies))
	}

	// Without a file no warning: inline limits are all there is by design.
	core2, logs2 := observer.New(zapcore.WarnLevel)
	NewServer(Options{Store: store, Logger: zap.New(core2)}).LogStart(StartInfo{})
	if n := logs2.FilterMessage(NoPoliciesWarning).Len(); n != 0 {
		t.Fatalf("start without --config: %d no-policies warnings, want 0", n)
	}
}
