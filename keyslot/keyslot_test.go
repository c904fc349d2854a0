package keyslot

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Of is Redis's: the values of the Redis Cluster specification.
func TestOf(t *testing.T) {
	for key, want := range map[string]uint16{
		"123456789": 12739, "foo{hash_tag}": 2515, "{hash_tag}bar": 2515, "somekey": 11058, "foo{}{bar}": 8363,
		"foo{{bar}}zap": 4015,
	} {
		if got := Of(key); got != want {
			t.Errorf("Of(%q) = %d, want %d", key, got, want)
		}
	}
}
