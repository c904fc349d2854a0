package redistest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"quotad/integration/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartAnswersAndAddressesAgree(t *testing.T) {
	s := redistest.Start(t)
	if got := s.URL(); got != "redis://"+s.Addr() {
		t.Fatalf("URL() = %q, want redis://%s", got, s.Addr())
	}
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr() = %q, want 127.0.0.1:port", s.Addr())
	}
	c := s.Client(t)
	if got, err := c.Do(t.Context(), c.B().Ping().Build()).ToString(); err != nil || got != "PONG" {
		t.Fatalf("PING = %q, %v", got, err)
	}
	if got, err := s.Do(t, "ECHO", "hi").ToString(); err != nil || got != "hi" {
		t.Fatalf("ECHO hi = %q, %v", got, err)
	}
}

func TestRestartKeepsAppendOnlyData(t *testing.T) {
	s := redistest.Start(t, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "always"))
	addr := s.Addr()
	if err := s.Do(t, "SET", "k", "v").Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("address changed across restart: %s -> %s", addr, s.Addr())
	}
	if got, err := s.Do(t, "GET", "k").ToString(); err != nil || got != "v" {
		t.Fatalf("GET k after restart = %q, %v; want v", got, err)
	}
}

func TestRestartWithoutPersistenceLosesData(t *testing.T) {
	s := redistest.Start(t)
	if err := s.Do(t, "SET", "k", "v").Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	s.Restart(t)
	if err := s.Do(t, "GET", "k").Error(); err == nil {
		t.Fatal("GET k after restart without persistence: want nil reply")
	}
}

func TestStopLeavesItStopped(t *testing.T) {
	s := redistest.Start(t)
	s.Stop(t)
	if err := s.Do(t, "PING").Error(); err == nil {
		t.Fatal("PING after Stop succeeded")
	}
	s.Stop(t) // a second Stop is harmless
}

func TestMissingBinaryFailsInsteadOfSkipping(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	rec := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }() // Fatalf in the recorder panics to stop Start
		redistest.Start(rec)
	}()
	if !rec.failed || rec.skipped {
		t.Fatalf("failed=%v skipped=%v, want a failure", rec.failed, rec.skipped)
	}
	if !strings.Contains(rec.msg, "make test") {
		t.Fatalf("message %q does not say to run make test", rec.msg)
	}
}

func TestAssertAllKeysHaveTTL(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client(t)
	for _, cmd := range [][]string{
		{"SET", "p*[x]:with-ttl", "v", "PX", "60000"},
		{"SET", "p*[x]:no-ttl", "v"},
		{"SET", "p*other:no-ttl", "v"}, // would match an unescaped p*
		{"SET", "unrelated", "v"},
	} {
		if err := s.Do(t, cmd...).Error(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	rec := &recorder{TB: t}
	redistest.AssertAllKeysHaveTTL(rec, c, "p*[x]:")
	if rec.errors != 1 || !strings.Contains(rec.msg, `"p*[x]:no-ttl"`) {
		t.Fatalf("got %d errors (%q), want exactly one about p*[x]:no-ttl", rec.errors, rec.msg)
	}
}

func TestDataDirIsPrivate(t *testing.T) {
	s := redistest.Start(t, redistest.WithArgs("--appendonly", "yes"))
	cfg, err := s.Do(t, "CONFIG", "GET", "dir").AsStrMap()
	if err != nil || cfg["dir"] == "" {
		t.Fatalf("CONFIG GET dir = %v, %v", cfg, err)
	}
	if _, err := os.Stat(filepath.Join(cfg["dir"], "appendonlydir")); err != nil {
		t.Fatalf("append-only dir not in %s: %v", cfg["dir"], err)
	}
}

// recorder captures failures so the harness's own failure paths can be tested.
type recorder struct {
	testing.TB
	failed, skipped bool
	errors          int
	msg             string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.failed = true
	r.errors++
	r.msg += fmt.Sprintf(format, args...) + "\n"
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic("fatal")
}

func (r *recorder) Skip(args ...any) { r.skipped = true; panic("skip") }
