package dispatch

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestWaitsIsAHistogram: a batch observed at once gathers as a
// prometheus.Histogram that observed each of its decisions does: the
// same buckets, bounds included in their bucket, count and sum.
func TestWaitsIsAHistogram(t *testing.T) {
	buckets := prometheus.ExponentialBuckets(0.0001, 2, 15)
	w := newWaits("w", "waits", buckets)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "w", Help: "waits", Buckets: buckets})
	q := time.Now()
	var batch []*Decision
	for _, s := range []float64{0, 0.0001, 0.00010001, 0.0002, 0.05, 0.0016 * 1024, 3, 0.0004} {
		dec := &Decision{queued: q}
		dec.trip.sent = q.Add(time.Duration(s * float64(time.Second)))
		batch = append(batch, dec)
		h.Observe(dec.trip.sent.Sub(q).Seconds())
	}
	w.observe(batch[:3]...)
	w.observe(batch[3:]...)
	got, want := gather(t, w), gather(t, h)
	// The sum to rounding: a batch adds its own sum.
	if got.GetSampleCount() != want.GetSampleCount() || math.Abs(got.GetSampleSum()-want.GetSampleSum()) > 1e-12 {
		t.Errorf("count %d sum %v, want %d and %v", got.GetSampleCount(), got.GetSampleSum(), want.GetSampleCount(), want.GetSampleSum())
	}
	if len(got.Bucket) != len(want.Bucket) {
		t.Fatalf("%d buckets, want %d", len(got.Bucket), len(want.Bucket))
	}
	for i, b := range got.Bucket {
		if b.GetUpperBound() != want.Bucket[i].GetUpperBound() || b.GetCumulativeCount() != want.Bucket[i].GetCumulativeCount() {
			t.Errorf("bucket %d: %v below %v, want %v below %v", i, b.GetCumulativeCount(), b.GetUpperBound(),
				want.Bucket[i].GetCumulativeCount(), want.Bucket[i].GetUpperBound())
		}
	}
}

func gather(t *testing.T, c prometheus.Collector) *dto.Histogram {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || len(mfs[0].Metric) != 1 || mfs[0].Metric[0].Histogram == nil {
		t.Fatalf("gathered %v, want one histogram", mfs)
	}
	return mfs[0].Metric[0].Histogram
}
