package descriptors

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// target is a Reloader's Target that remembers what it was told.
type target struct {
	mu      sync.Mutex
	cfg     *Config
	reloads []error
	changed chan struct{}
}

func (t *target) Config() *Config {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cfg
}

func (t *target) SetConfig(c *Config) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cfg = c
}

func (t *target) Reloaded(err error) {
	t.mu.Lock()
	t.reloads = append(t.reloads, err)
	t.mu.Unlock()
	if t.changed != nil {
		t.changed <- struct{}{}
	}
}

func limitOf(t *testing.T, c *Config) uint32 {
	t.Helper()
	m, ok := c.Match("r", e("k", "v"))
	if !ok {
		t.Fatal("no match")
	}
	return m.Limit.RequestsPerUnit
}

// A directory laid out as a Kubernetes ConfigMap volume lays it out: each
// visible name a symlink through ..data, which is swapped atomically.
func TestReloaderKeepsTheLastGoodConfig(t *testing.T) {
	dir := t.TempDir()
	version := 0
	write := func(body string) {
		t.Helper()
		version++
		v := "..v" + string(rune('0'+version))
		if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, v, "r.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(v, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	limit := func(n string) string {
		return "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + n + "}\n"
	}
	write(limit("5"))
	if err := os.Symlink(filepath.Join("..data", "r.yaml"), filepath.Join(dir, "r.yaml")); err != nil {
		t.Fatal(err)
	}
	tgt := &target{cfg: mustLoad(t, dir)}
	core, logs := observer.New(zap.InfoLevel)
	r := NewReloader(dir, time.Hour, tgt, zap.New(core))

	if r.Load(false) {
		t.Fatal("reloaded unchanged files")
	}
	write(limit("fortnight"))
	if r.Load(false) || limitOf(t, tgt.Config()) != 5 {
		t.Fatal("a bad file replaced the config in use")
	}
	if r.Load(false) {
		t.Fatal("reloaded the same bad file")
	}
	write(limit("7"))
	if !r.Load(false) || limitOf(t, tgt.Config()) != 7 {
		t.Fatal("the good file after the swap was not loaded")
	}
	if len(tgt.reloads) != 2 || tgt.reloads[0] == nil || tgt.reloads[1] != nil {
		t.Fatalf("reloads counted %v, want a failure then a success", tgt.reloads)
	}
	if n := logs.FilterMessage("rls config reload failed; keeping the config in use").Len(); n != 1 {
		t.Errorf("%d failure lines, want 1", n)
	}
	if n := logs.FilterMessage("rls config reloaded").Len(); n != 1 {
		t.Errorf("%d reload lines, want 1", n)
	}

	// Check refuses a config that loads, until what it checks changes.
	missing := true
	r.Check = func(c *Config) error {
		if missing {
			return c.MissingPolicies(func(string) bool { return false })
		}
		return nil
	}
	write("domain: r\ndescriptors:\n  - key: k\n    rate_limit: {quotad_policy: p}\n")
	if r.Load(false) || limitOf(t, tgt.Config()) != 7 {
		t.Fatal("a config Check refused is in use")
	}
	missing = false
	if !r.Load(false) || tgt.Config().Policies()[0] != "p" {
		t.Fatal("the config was not taken once Check passed")
	}
}

// Run reloads on Trigger and stops with its context.
func TestReloaderRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.yaml")
	if err := os.WriteFile(path, []byte("domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tgt := &target{cfg: mustLoad(t, path), changed: make(chan struct{}, 1)}
	r := NewReloader(path, time.Hour, tgt, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	if err := os.WriteFile(path, []byte("domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 9}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.Trigger()
	<-tgt.changed
	if got := limitOf(t, tgt.Config()); got != 9 {
		t.Errorf("limit %d after Trigger, want 9", got)
	}
	cancel()
	<-done
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	r.Load(true)
	if len(tgt.reloads) != 2 || !errors.Is(tgt.reloads[1], os.ErrNotExist) {
		t.Errorf("reloads %v", tgt.reloads)
	}
}
