package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
policies:
  api:
    algorithm: fixed_window
    limit: 100
    window: 1m
    max_request_ids: 500
  login.v2:
    limit: 5
    window: 1500ms
`))
	if err != nil {
		t.Fatal(err)
	}
	api := cfg.Policies["api"]
	if api == nil || api.Limit != 100 || api.WindowMS != 60000 || api.MaxRequestIDs != 500 || api.Algorithm != AlgorithmFixedWindow {
		t.Fatalf("api = %+v", api)
	}
	login := cfg.Policies["login.v2"]
	if login == nil || login.WindowMS != 1500 || login.MaxRequestIDs != DefaultMaxRequestIDs {
		t.Fatalf("login.v2 = %+v", login)
	}
	if got := strings.Join(cfg.Names(), ","); got != "api,login.v2" {
		t.Fatalf("names = %s", got)
	}
}

func TestParseConfigErrorsNamePolicyAndField(t *testing.T) {
	for _, tc := range []struct{ yaml, policy, field string }{
		{"policies:\n  api:\n    window: 1m\n", "api", "limit"},
		{"policies:\n  api:\n    limit: 0\n    window: 1m\n", "api", "limit"},
		{"policies:\n  api:\n    limit: 1000000001\n    window: 1m\n", "api", "limit"},
		{"policies:\n  api:\n    limit: 5\n", "api", "window"},
		{"policies:\n  api:\n    limit: 5\n    window: soon\n", "api", "window"},
		{"policies:\n  api:\n    limit: 5\n    window: 1500us\n", "api", "window"},
		{"policies:\n  api:\n    limit: 5\n    window: 745h\n", "api", "window"},
		{"policies:\n  api:\n    limit: 5\n    window: 1m\n    algorithm: leaky\n", "api", "algorithm"},
		{"policies:\n  api:\n    limit: 5\n    window: 1m\n    max_request_ids: 0\n", "api", "max_request_ids"},
		{"policies:\n  api:\n    limit: 2.9\n    window: 1m\n", "api", "limit"},
		{"policies:\n  api:\n    limit: '5'\n    window: 1m\n", "api", "limit"},
		{"policies:\n  api:\n    limit: [5]\n    window: 1m\n", "api", "limit"},
		{"policies:\n  api:\n    limit: 5\n    window: 1m\n    max_request_ids: 1.7\n", "api", "max_request_ids"},
		{"policies:\n  'a:b':\n    limit: 5\n    window: 1m\n", "a:b", ""},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%q: err = %v, want a ConfigError", tc.yaml, err)
			continue
		}
		if ce.Policy != tc.policy || ce.Field != tc.field {
			t.Errorf("%q: policy %q field %q, want %q %q (%v)", tc.yaml, ce.Policy, ce.Field, tc.policy, tc.field, err)
		}
	}
}

func TestParseConfigRejectsUnknownFieldsAndBadYAML(t *testing.T) {
	for _, y := range []string{
		"policies:\n  api:\n    limit: 5\n    window: 1m\n    limt: 6\n",
		"polices: {}\n",
		"policies: [\n",
		"policies:\n  api:\n    limit: five\n    window: 1m\n",
	} {
		if _, err := ParseConfig([]byte(y)); err == nil {
			t.Errorf("%q: accepted", y)
		}
	}
	cfg, err := ParseConfig(nil)
	if err != nil || len(cfg.Policies) != 0 {
		t.Fatalf("empty file: %v %v", cfg, err)
	}
}

func TestReloaderKeepsOldConfigOnBadFileAndFollowsSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	// Lay the file out as a Kubernetes ConfigMap volume does: the visible
	// name is a symlink through ..data, which is swapped atomically.
	write := func(version, body string) {
		d := filepath.Join(dir, version)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "quotad.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	write("v1", "policies:\n  api:\n    limit: 5\n    window: 1m\n")
	path := filepath.Join(dir, "quotad.yaml")
	if err := os.Symlink(filepath.Join("..data", "quotad.yaml"), path); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &target{cfg: cfg}
	r := NewReloader(path, time.Hour, srv, zap.NewNop())

	write("v2", "policies:\n  api:\n    limit: 0\n    window: 1m\n")
	r.load(false)
	if got := srv.Config().Policies["api"].Limit; got != 5 {
		t.Fatalf("after a bad file limit = %d, want the old 5", got)
	}
	write("v3", "policies:\n  api:\n    limit: 7\n    window: 1m\n")
	r.load(false)
	if got := srv.Config().Policies["api"].Limit; got != 7 {
		t.Fatalf("after the swap limit = %d, want 7", got)
	}
	if len(srv.reloads) != 2 || srv.reloads[0] == nil || srv.reloads[1] != nil {
		t.Fatalf("reloads counted %v, want a failure then a success", srv.reloads)
	}
}

// target is a Reloader's Target that remembers what it was told.
type target struct {
	cfg     *Config
	reloads []error
}

func (t *target) Config() *Config     { return t.cfg }
func (t *target) SetConfig(c *Config) { t.cfg = c }
func (t *target) Reloaded(err error)  { t.reloads = append(t.reloads, err) }
