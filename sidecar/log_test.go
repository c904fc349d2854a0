package sidecar

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
