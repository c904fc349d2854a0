package limits

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		field string // "" for no error
	}{
		{"limit ok", ValidateFixedWindow(1, 1), ""},
		{"limit max", ValidateFixedWindow(MaxLimit, MaxWindowMS), ""},
		{"limit zero", ValidateFixedWindow(0, 1), "limit"},
		{"limit over", ValidateFixedWindow(MaxLimit+1, 1), "limit"},
		{"window over", ValidateFixedWindow(1, MaxWindowMS+1), "window_ms"},
		{"bucket ok", ValidateTokenBucket(10, 1000, 20), ""},
		{"bucket refill too long", ValidateTokenBucket(1, MaxWindowMS, 2), "burst"},
		{"bucket rate", ValidateTokenBucket(0, 1000, 1), "rate"},
		{"leases ok", ValidateConcurrency(MaxLeases, 1), ""},
		{"leases over", ValidateConcurrency(MaxLeases+1, 1), "limit"},
		{"lease over", ValidateConcurrency(1, MaxWindowMS+1), "lease_ms"},
		{"ids over", ValidateMaxRequestIDs(MaxRequestIDs + 1), "max_request_ids"},
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

func TestValidPolicyName(t *testing.T) {
	for name, want := range map[string]bool{
		"api": true, "A.b-c_9": true, strings.Repeat("p", MaxPolicyNameBytes): true,
		"": false, strings.Repeat("p", MaxPolicyNameBytes+1): false, "a:b": false, "a b": false, "é": false, "a/b": false,
	} {
		if got := ValidPolicyName(name); got != want {
			t.Errorf("ValidPolicyName(%q) = %v, want %v", name, got, want)
		}
	}
}

// The texts that name a bound in words say the bound's number.
func TestRuleTexts(t *testing.T) {
	for text, want := range map[string]string{
		RequestIDRule:   "1 to " + strconv.Itoa(MaxRequestIDBytes) + " of",
		PolicyNameChars: "1 to " + strconv.Itoa(MaxPolicyNameBytes) + " of",
		MaxWindowText:   strconv.Itoa(int(MaxWindow/time.Hour)) + "h (" + strconv.Itoa(int(MaxWindow/(24*time.Hour))) + " days)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("%q does not say %q", text, want)
		}
	}
	if MaxWindow%time.Hour != 0 || MaxWindow%(24*time.Hour) != 0 {
		t.Errorf("MaxWindow %v is not whole days, as MaxWindowText says", MaxWindow)
	}
}
