package loadgen

import (
	"testing"
	"time"
)

func TestBucketsCoverEveryValueInOrder(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 63, 64, 65, 127, 128, 1000, 1 << 20, 1<<20 + 12345, 1 << 40} {
		i := bucketOf(v)
		if i < prev {
			t.Fatalf("bucketOf(%d) = %d, below the previous value's bucket %d", v, i, prev)
		}
		prev = i
		low := bucketLow(i)
		if low > v {
			t.Fatalf("bucketLow(bucketOf(%d)) = %d, above the value", v, low)
		}
		// The next bucket starts above v: the error is at most one bucket wide.
		if next := bucketLow(i + 1); next <= v {
			t.Fatalf("value %d is past its bucket [%d, %d)", v, low, next)
		}
		if v >= 64 && float64(v-low) > 0.016*float64(v) {
			t.Fatalf("value %d counted as %d: more than 1.6%% off", v, low)
		}
	}
}

func TestQuantiles(t *testing.T) {
	var h histogram
	if h.quantile(0.5) != 0 {
		t.Fatal("an empty histogram has a median")
	}
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.9, 900 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {0.999, 999 * time.Microsecond}} {
		got := h.quantile(c.q)
		if got > c.want || float64(c.want-got) > 0.016*float64(c.want) {
			t.Errorf("quantile(%v) = %v, want %v within 1.6%% below", c.q, got, c.want)
		}
	}
	var m histogram
	m.merge(&h)
	m.merge(&h)
	if m.total != 2000 || m.quantile(0.5) != h.quantile(0.5) {
		t.Fatalf("merged: total %d median %v, want 2000 and %v", m.total, m.quantile(0.5), h.quantile(0.5))
	}
}
