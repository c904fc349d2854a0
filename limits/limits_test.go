package limits

import (
	"errors"
	"testing"
)

func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		field string // "" for no error
	}{
		{"limit ok", CheckFixedWindow(1, 1), ""},
		{"limit max", CheckFixedWindow(MaxLimit, MaxWindowMS), ""},
		{"limit zero", CheckFixedWindow(0, 1), "limit"},
		{"limit over", CheckFixedWindow(MaxLimit+1, 1), "limit"},
		{"window over", CheckFixedWindow(1, MaxWindowMS+1), "window_ms"},
		{"bucket ok", CheckTokenBucket(10, 1000, 20), ""},
		{"bucket refill too long", CheckTokenBucket(1, MaxWindowMS, 2), "burst"},
		{"bucket rate", CheckTokenBucket(0, 1000, 1), "rate"},
		{"leases ok", CheckConcurrency(MaxLeases, 1), ""},
		{"leases over", CheckConcurrency(MaxLeases+1, 1), "limit"},
		{"lease over", CheckConcurrency(1, MaxWindowMS+1), "lease_ms"},
		{"ids over", CheckMaxRequestIDs(MaxRequestIDs + 1), "max_request_ids"},
	} {
		var le *Error
		switch {
		case tc.field == "" && tc.err != nil:
			t.Errorf("%s: unexpected error %v", tc.name, tc.err)
		case tc.field != "" && !errors.As(tc.err, &le):
			t.Errorf("%s: got %v, want an *Error", tc.name, tc.err)
		case tc.field != "" && le.Field != tc.field:
			t.Errorf("%s: field %q, want %q (%v)", tc.name, le.Field, tc.field, le)
		}
	}
}

func TestValidRequestID(t *testing.T) {
	long := make([]byte, MaxRequestIDBytes)
	for i := range long {
		long[i] = 'a'
	}
	for id, want := range map[string]bool{
		"": false, "a": true, "A-z_09": true, "a.b": false, "a b": false, "é": false,
		string(long): true, string(long) + "a": false,
	} {
		if got := ValidRequestID(id); got != want {
			t.Errorf("ValidRequestID(%q) = %v, want %v", id, got, want)
		}
	}
}
