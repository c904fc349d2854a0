package policy

import (
	"errors"
	"testing"

	"quotad/limits"
)

func TestParseConfigSlidingWindow(t *testing.T) {
	cfg, err := ParseConfig([]byte("policies:\n  api:\n    algorithm: sliding_window\n    limit: 100\n    window: 1m\n    max_request_ids: 50\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Policies["api"]
	if p.Algorithm != limits.SlidingWindow || p.Shape() != (limits.Sliding{Limit: 100, WindowMS: 60000}) || p.MaxRequestIDs != 50 {
		t.Fatalf("api = %+v, shape %#v", p, p.Shape())
	}
	for _, tc := range []struct{ yaml, field string }{
		{"algorithm: sliding_window\n    window: 1s", "limit"},
		{"algorithm: sliding_window\n    limit: 0\n    window: 1s", "limit"},
		{"algorithm: sliding_window\n    limit: 1", "window"},
		{"algorithm: sliding_window\n    limit: 1\n    window: 745h", "window"},
		{"algorithm: sliding_window\n    limit: 1\n    window: 1s\n    max_request_ids: 0", "max_request_ids"},
		{"algorithm: sliding_window\n    limit: 1\n    window: 1s\n    rate: 1", "rate"},
		{"algorithm: sliding_window\n    limit: 1\n    window: 1s\n    lease: 1s", "lease"},
	} {
		_, err := ParseConfig([]byte("policies:\n  p:\n    " + tc.yaml + "\n"))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Policy != "p" || ce.Field != tc.field {
			t.Errorf("%q: err = %v, want a ConfigError for policy p, field %s", tc.yaml, err, tc.field)
		}
	}
}
