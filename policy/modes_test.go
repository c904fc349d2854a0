package policy

import (
	"errors"
	"testing"
)

func TestParseConfigOnUnavailable(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
policies:
  default:
    limit: 5
    window: 1m
  open:
    limit: 5
    window: 1m
    on_unavailable: allow
  closed:
    limit: 5
    window: 1m
    on_unavailable: deny
  strict:
    limit: 5
    window: 1m
    on_unavailable: error
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"default": OnUnavailableError, "open": OnUnavailableAllow, "closed": OnUnavailableDeny, "strict": OnUnavailableError} {
		if got := cfg.Policies[name].OnUnavailable; got != want {
			t.Errorf("policy %s: on_unavailable %q, want %q", name, got, want)
		}
	}
	for _, bad := range []string{"Allow", "open", "true", "''", "[allow]", "1", "~"} {
		_, err := ParseConfig([]byte("policies:\n  api:\n    limit: 5\n    window: 1m\n    on_unavailable: " + bad + "\n"))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Policy != "api" || ce.Field != "on_unavailable" {
			t.Errorf("on_unavailable %s: err = %v, want a ConfigError naming api and on_unavailable", bad, err)
		}
	}
}

func TestParseConfigMode(t *testing.T) {
	cfg, err := ParseConfig([]byte("policies:\n  a:\n    limit: 1\n    window: 1s\n  b:\n    limit: 1\n    window: 1s\n    mode: shadow\n  c:\n    limit: 1\n    window: 1s\n    mode: enforce\n"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a": ModeEnforce, "b": ModeShadow, "c": ModeEnforce} {
		if got := cfg.Policies[name].Mode; got != want {
			t.Errorf("policy %s: mode %q, want %q", name, got, want)
		}
	}
	_, err = ParseConfig([]byte("policies:\n  a:\n    limit: 1\n    window: 1s\n    mode: dry-run\n"))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Policy != "a" || ce.Field != "mode" {
		t.Fatalf("mode dry-run: got %v, want a ConfigError naming policy a, field mode", err)
	}
}
