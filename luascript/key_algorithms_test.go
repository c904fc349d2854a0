package luascript_test

import (
	"testing"

	"quotad/luascript"
)

// Each algorithm has its own keys, laid out like the fixed window's, so a
// policy that changes algorithm never reads another algorithm's state.
func TestAlgorithmKeys(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{luascript.TokenBucketKey("q:", "api", "u"), "q:tb:{p:api:u}"},
		{luascript.TokenBucketKey("q:", "", "u"), "q:tb:{i:u}"},
		{luascript.ConcurrencyKey("q:", "api", "u"), "q:cc:{p:api:u}"},
		{luascript.ConcurrencyKey("q:", "", "u"), "q:cc:{i:u}"},
	} {
		if tc.got != tc.want {
			t.Errorf("key = %q, want %q", tc.got, tc.want)
		}
	}
	seen := map[string]bool{}
	for _, policy := range []string{"", "api"} {
		for _, k := range []string{
			luascript.FixedWindowKey("q:", policy, "u"),
			luascript.TokenBucketKey("q:", policy, "u"),
			luascript.ConcurrencyKey("q:", policy, "u"),
		} {
			if seen[k] {
				t.Errorf("two algorithms share key %q", k)
			}
			seen[k] = true
		}
	}
}
