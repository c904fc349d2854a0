package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/limits"
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
	if api == nil || api.Limit != 100 || api.WindowMS != 60000 || api.MaxRequestIDs != 500 || api.Algorithm != limits.FixedWindow {
		t.Fatalf("api = %+v", api)
	}
	login := cfg.Policies["login.v2"]
	if login == nil || login.WindowMS != 1500 || login.MaxRequestIDs != limits.DefaultMaxRequestIDs {
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

// What an operator reads for each mistake, word for word: the line, the
// policy, the field, and for a typo the field meant.
func TestParseConfigMessages(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"policies:\n  login:\n    limit: 5\n    windwo: 15m\n",
			`line 4: policy "login": unknown field "windwo" (did you mean "window"?)`},
		{"policies:\n  login:\n    limt: 5\n    window: 15m\n",
			`line 3: policy "login": unknown field "limt" (did you mean "limit"?)`},
		{"policies:\n  login:\n    Limit: 5\n    window: 15m\n",
			`line 3: policy "login": unknown field "Limit" (did you mean "limit"?)`},
		{"policies:\n  login:\n    limit: 5\n    window: 15m\n    colour: red\n",
			`line 5: policy "login": unknown field "colour"`},
		{"polices:\n  login:\n    limit: 5\n    window: 15m\n",
			`line 1: unknown top-level key "polices" (did you mean "policies"?)`},
		{"version: 2\n",
			`line 1: unknown top-level key "version"`},
		{"policies:\n  api:\n    limit: 5\n    window: soon\n",
			`line 4: policy "api": window: not a duration: "soon"`},
		{"policies:\n  api:\n    window: 1m\n",
			`line 2: policy "api": limit: is required`},
		{"policies:\n  api:\n    limit: 5\n    window: [1m]\n",
			`line 4: policy "api": window: must be a single value, got a list`},
		{"policies:\n  api:\n    limit: 5\n    limit: 6\n    window: 1m\n",
			`line 4: policy "api": limit: given twice`},
		{"policies:\n  api:\n    limit: 5\n    window: 1m\n  api:\n    limit: 6\n    window: 1m\n",
			`line 5: policy "api": defined twice (first at line 2)`},
		{"policies:\n  api: 5\n",
			`line 2: policy "api": must be a mapping of fields such as limit: and window:`},
		{"policies:\n  api:\n    limit: 5\n    window: 1m\npolicies:\n  b:\n    limit: 1\n    window: 1m\n",
			`line 5: policies: given twice (first at line 1)`},
		{"policies: [api]\n",
			`line 1: policies: must be a mapping of policy names to policies`},
		{"- api\n",
			`line 1: the file must be a mapping with a policies: key`},
		{"policies:\n  api:\n    limit: 5\n    window: 1m\n    windwo: 2m\n  login:\n    limit: 0\n    window: 1m\n",
			`line 5: policy "api": unknown field "windwo" (did you mean "window"?)` + "\n" +
				`line 7: policy "login": limit: must be from 1 to 1000000000, got 0`},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q:\n got %v\nwant %s", tc.yaml, err, tc.want)
		}
	}
}

// Every policy is checked; each problem is its own ConfigError.
func TestParseConfigReportsEveryPolicy(t *testing.T) {
	_, err := ParseConfig([]byte("policies:\n  a:\n    limit: 0\n    window: 1m\n  b:\n    limit: 1\n  c:\n    limit: 1\n    window: 1m\n  d:\n    algorithm: leaky\n"))
	var errs ConfigErrors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Fatalf("err = %v, want ConfigErrors with 3 problems", err)
	}
	for i, want := range []struct {
		policy, field string
		line          int
	}{{"a", "limit", 3}, {"b", "window", 5}, {"d", "algorithm", 11}} {
		if e := errs[i]; e.Policy != want.policy || e.Field != want.field || e.Line != want.line {
			t.Errorf("problem %d = %+v, want policy %s field %s line %d", i, e, want.policy, want.field, want.line)
		}
	}
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Policy != "a" {
		t.Fatalf("errors.As(*ConfigError) = %+v, want the first problem", ce)
	}
}

func TestLoadConfigNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.yaml")
	if err := os.WriteFile(path, []byte("policies:\n  api:\n    limit: 5\n    windwo: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if want := path + `:4: policy "api": unknown field "windwo" (did you mean "window"?)`; err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}

// YAML anchors and merge keys work as they did when the file was decoded
// into structs: a policy's own fields win over merged ones.
func TestParseConfigMergeKeys(t *testing.T) {
	cfg, err := ParseConfig([]byte("policies:\n  api: &api\n    limit: 5\n    window: 1m\n  login:\n    <<: *api\n    limit: 2\n  copy: *api\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Policies["login"]; l == nil || l.Limit != 2 || l.WindowMS != 60000 {
		t.Fatalf("login = %+v, want limit 2 and the merged 1m window", l)
	}
	if c := cfg.Policies["copy"]; c == nil || c.Limit != 5 {
		t.Fatalf("copy = %+v, want api's limit", c)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"window", "window", 0}, {"windwo", "window", 1}, {"limt", "limit", 1},
		{"", "abc", 3}, {"lease", "rate", 3}, {"polices", "policies", 1}, {"burts", "burst", 1},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// A reload to a file without policies is warned of: it answers inline
// limits only.
func TestReloadToNoPoliciesIsWarnedOf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.yaml")
	write := func(body string) {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("policies:\n  api:\n    limit: 1\n    window: 1s\n")
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	srv := &target{cfg: cfg}
	r := NewReloader(path, time.Hour, srv, zap.New(core))
	write("# emptied\n")
	r.load(false)
	if n := logs.FilterMessage(NoPoliciesWarning).FilterField(zap.String(keyConfig, path)).Len(); n != 1 || len(srv.Config().Policies) != 0 {
		t.Fatalf("reload to no policies: %d warnings, %d policies; want 1 and 0", n, len(srv.Config().Policies))
	}
}
