package luascript_test

import (
	"testing"

	"quotad/luascript"
)

func TestFixedWindowKey(t *testing.T) {
	for _, tc := range []struct {
		prefix, policy, subject, want string
	}{
		{"q:", "api", "user-1", "q:fw:{p:api:user-1}"},
		{"q:", "", "user-1", "q:fw:{i:user-1}"},
		{"", "a.b_c-9", "", "fw:{p:a.b_c-9:}"},
		{"q:", "api", "x:y}{z", "q:fw:{p:api:x:y}{z}"},
	} {
		if got := luascript.FixedWindowKey(tc.prefix, tc.policy, tc.subject); got != tc.want {
			t.Errorf("FixedWindowKey(%q, %q, %q) = %q, want %q", tc.prefix, tc.policy, tc.subject, got, tc.want)
		}
	}
}

// Subjects are arbitrary bytes, so they may look like another policy's key.
func TestFixedWindowKeyNeverCollides(t *testing.T) {
	pairs := [][2]string{
		{"", "p:api:u"}, {"api", "u"},
		{"", "u"}, {"i", "u"},
		{"a", "b:c"}, {"a.b", "c"},
		{"api", "u}"}, {"api", "u{"},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		k := luascript.FixedWindowKey("q:", p[0], p[1])
		if prev, ok := seen[k]; ok {
			t.Errorf("%v and %v share key %q", prev, p, k)
		}
		seen[k] = p
	}
}
