package policy

import (
	"errors"
	"strings"
	"testing"

	"quotad/limits"
)

func TestAllotment(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
policies:
  api:
    limit: 10000
    window: 1m
    allotment:
      max_share: 0.1
      idle: 500ms
  defaults:
    limit: 10000
    window: 1m
    allotment: {}
  bucket:
    algorithm: token_bucket
    rate: 100
    period: 1s
    allotment: {max_share: 1}
  sliding:
    algorithm: sliding_window
    limit: 100
    window: 1s
    allotment: {idle: 10ms}
  month:
    algorithm: calendar
    limit: 100
    period: month
    allotment: {idle: 1m}
  none:
    limit: 5
    window: 1s
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]*limits.Allotment{
		"api":      {SharePPM: 100_000, IdleMS: 500},
		"defaults": {SharePPM: limits.DefaultAllotmentSharePPM, IdleMS: limits.DefaultAllotmentIdleMS},
		"bucket":   {SharePPM: limits.ShareScale, IdleMS: limits.DefaultAllotmentIdleMS},
		"sliding":  {SharePPM: limits.DefaultAllotmentSharePPM, IdleMS: 10},
		"month":    {SharePPM: limits.DefaultAllotmentSharePPM, IdleMS: 60_000},
	} {
		if got := cfg.Policies[name].Allotment; got == nil || *got != *want {
			t.Errorf("%s: allotment %+v, want %+v", name, got, want)
		}
	}
	if a := cfg.Policies["none"].Allotment; a != nil {
		t.Errorf("a policy without allotment: has %+v", a)
	}
}

func TestAllotmentErrorsNameThePolicy(t *testing.T) {
	for _, tc := range []struct{ allotment, want string }{
		{"{max_share: 0}", "max_share"},
		{"{max_share: 1.5}", "max_share"},
		{"{max_share: -0.1}", "max_share"},
		{"{max_share: '0.1'}", "max_share"},
		{"{max_share: 0.0000001}", "max_share"},
		{"{idle: 9ms}", "idle"},
		{"{idle: 61s}", "idle"},
		{"{idle: 10500us}", "idle"},
		{"{idle: soon}", "idle"},
		{"{idel: 1s}", `did you mean "idle"`},
		{"{idle: 1s, idle: 2s}", "given twice"},
		{"5", "must be a mapping"},
		{"[0.1]", "must be a mapping"},
	} {
		_, err := ParseConfig([]byte("policies:\n  api:\n    limit: 5\n    window: 1m\n    allotment: " + tc.allotment + "\n"))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Policy != "api" || ce.Field != "allotment" || ce.Line != 5 || !strings.Contains(ce.Msg, tc.want) {
			t.Errorf("allotment: %s: got %v, want a config error of policy api, field allotment, line 5, saying %q", tc.allotment, err, tc.want)
		}
	}
}

func TestConcurrencyPolicyRefusesAnAllotment(t *testing.T) {
	_, err := ParseConfig([]byte("policies:\n  workers:\n    algorithm: concurrency\n    limit: 5\n    lease: 30s\n    allotment: {}\n"))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Policy != "workers" || ce.Field != "allotment" || !strings.Contains(err.Error(), `policy "workers"`) {
		t.Fatalf("got %v, want a config error naming policy workers and its allotment", err)
	}
}
