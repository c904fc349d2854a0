package luascript_test

import (
	"testing"

	"quotad/keyslot"
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

// A subject's own hash tag is its keys' tag, under every algorithm and
// policy, and the tagged form never collides with the other.
func TestSubjectHashTag(t *testing.T) {
	subject := "{tenant-42}:user-7"
	keys := []string{
		luascript.FixedWindowKey("q:", "api", subject), luascript.TokenBucketKey("q:", "burst", subject),
		luascript.ConcurrencyKey("q:", "", subject), luascript.SlidingWindowKey("q:", "sw", subject),
		luascript.CalendarPeriodKey(luascript.CalendarKey("q:", "daily", subject), 1700000000000),
		luascript.FixedWindowKey("q:", "", "{tenant-42}"),
	}
	if keys[0] != "q:fw:p:api:{tenant-42}:user-7" || keys[2] != "q:cc:i:{tenant-42}:user-7" {
		t.Fatalf("keys %q", keys)
	}
	for _, k := range keys {
		if got, want := keyslot.Of(k), keyslot.Of("{tenant-42}"); got != want {
			t.Errorf("keyslot.Of(%q) = %d, want the tag's %d", k, got, want)
		}
	}
	seen := map[string]string{}
	for _, s := range []string{"{t}x", "{}x", "x}{", "{t", "t}", "p:api:{t}x", "{p:api:{t}x}"} {
		for _, p := range []string{"", "api"} {
			k := luascript.FixedWindowKey("q:", p, s)
			if prev, ok := seen[k]; ok {
				t.Errorf("%q and %q share key %q", prev, p+"/"+s, k)
			}
			seen[k] = p + "/" + s
		}
	}
	if luascript.HasHashTag("{}x") || luascript.HasHashTag("x}{") || !luascript.HasHashTag("a{b}") {
		t.Fatal("HasHashTag")
	}
}
