package policy

import (
	"errors"
	"strings"
	"testing"

	"quotad/limits"
)

func TestParseConfigAlgorithms(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
policies:
  smooth:
    algorithm: token_bucket
    rate: 10
    period: 1s
    burst: 20
  default-burst:
    algorithm: token_bucket
    rate: 3
    period: 1m
    dedupe: 2h
    max_request_ids: 50
  jobs:
    algorithm: concurrency
    limit: 2
    lease: 30s
`))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Policies["smooth"]; p.Rate != 10 || p.PeriodMS != 1000 || p.Burst != 20 || p.Limit != 20 || p.DedupeMS != 2000 || p.MaxRequestIDs != limits.DefaultMaxRequestIDs {
		t.Fatalf("smooth = %+v, want burst 20 as its limit and a 2 s refill as its dedupe horizon", p)
	}
	if p := cfg.Policies["default-burst"]; p.Burst != 3 || p.DedupeMS != 7_200_000 || p.MaxRequestIDs != 50 {
		t.Fatalf("default-burst = %+v, want burst = rate, dedupe 2h", p)
	}
	if p := cfg.Policies["jobs"]; p.Algorithm != limits.Concurrency || p.Limit != 2 || p.LeaseMS != 30000 {
		t.Fatalf("jobs = %+v", p)
	}
}

func TestParseConfigAlgorithmErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ yaml, field string }{
		{"algorithm: token_bucket\n    period: 1s", "rate"},
		{"algorithm: token_bucket\n    rate: 0\n    period: 1s", "rate"},
		{"algorithm: token_bucket\n    rate: 1.5\n    period: 1s", "rate"},
		{"algorithm: token_bucket\n    rate: 1", "period"},
		{"algorithm: token_bucket\n    rate: 1\n    period: 1us", "period"},
		{"algorithm: token_bucket\n    rate: 1\n    period: 1s\n    burst: 0", "burst"},
		{"algorithm: token_bucket\n    rate: 1\n    period: 400h\n    burst: 2", "burst"},
		{"algorithm: token_bucket\n    rate: 1\n    period: 1s\n    dedupe: forever", "dedupe"},
		{"algorithm: token_bucket\n    rate: 1\n    period: 1s\n    window: 1s", "window"},
		{"algorithm: token_bucket\n    rate: 1\n    period: 1s\n    limit: 1", "limit"},
		{"algorithm: concurrency\n    lease: 1s", "limit"},
		{"algorithm: concurrency\n    limit: 100001\n    lease: 1s", "limit"},
		{"algorithm: concurrency\n    limit: 1", "lease"},
		{"algorithm: concurrency\n    limit: 1\n    lease: 1s\n    max_request_ids: 5", "max_request_ids"},
		{"algorithm: concurrency\n    limit: 1\n    lease: 1s\n    rate: 5", "rate"},
		{"limit: 1\n    window: 1s\n    lease: 1s", "lease"},
		{"limit: 1\n    window: 1s\n    burst: 1", "burst"},
	} {
		_, err := ParseConfig([]byte("policies:\n  p:\n    " + tc.yaml + "\n"))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Policy != "p" || ce.Field != tc.field {
			t.Errorf("%q: err = %v, want a ConfigError for policy p, field %s", tc.yaml, err, tc.field)
		}
	}
	_, err := ParseConfig([]byte("policies:\n  p:\n    algorithm: leaky\n    rate: 1\n"))
	if err == nil || !strings.Contains(err.Error(), "token_bucket, concurrency") {
		t.Errorf("unknown algorithm: err = %v, want the supported ones listed", err)
	}
}
