package dispatch

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// waits is the histogram of how long each decision sent to Redis waited
// inside quotad (quotad_redis_queue_seconds), observed a batch at a time:
// a batch adds its decisions' counts and sum once, where a
// prometheus.Histogram takes an Observe per decision, each a few atomic
// writes that the batches in flight make on the same counters. It is
// gathered as a histogram like any other.
type waits struct {
	desc    *prometheus.Desc
	upper   []float64 // the buckets' upper bounds, increasing
	created time.Time

	mu     sync.Mutex
	counts []uint64 // per bucket, the last for +Inf
	n      uint64
	sum    float64
}

// maxWaitBuckets bounds the buckets of a waits, whose observe counts a
// batch on its stack.
const maxWaitBuckets = 31

func newWaits(name, help string, buckets []float64) *waits {
	if len(buckets) > maxWaitBuckets {
		panic("dispatch: too many buckets for a waits histogram")
	}
	return &waits{
		desc:  prometheus.NewDesc(name, help, nil, nil),
		upper: buckets, created: time.Now(), counts: make([]uint64, len(buckets)+1),
	}
}

// observe counts how long each of decs waited, from when it began
// waiting (Run) to when its call was sent (trip.sent).
func (w *waits) observe(decs ...*Decision) {
	var counts [maxWaitBuckets + 1]uint64
	sum := 0.0
	for _, dec := range decs {
		s := dec.trip.sent.Sub(dec.queued).Seconds()
		// A value on a bound is in that bound's bucket, as Observe has it.
		counts[sort.SearchFloat64s(w.upper, s)]++
		sum += s
	}
	w.mu.Lock()
	for i := range w.counts {
		w.counts[i] += counts[i]
	}
	w.n += uint64(len(decs))
	w.sum += sum
	w.mu.Unlock()
}

func (w *waits) Describe(ch chan<- *prometheus.Desc) { ch <- w.desc }

func (w *waits) Collect(ch chan<- prometheus.Metric) {
	buckets := make(map[float64]uint64, len(w.upper))
	w.mu.Lock()
	n, sum, cum := w.n, w.sum, uint64(0)
	for i, u := range w.upper {
		cum += w.counts[i]
		buckets[u] = cum
	}
	w.mu.Unlock()
	ch <- prometheus.MustNewConstHistogramWithCreatedTimestamp(w.desc, n, sum, buckets, w.created)
}
