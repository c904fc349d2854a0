package loadgen

import (
	"math/bits"
	"time"
)

// histogram counts durations in log-linear buckets: exact below 64 ns, then
// 64 buckets per power of two, so any percentile is within 1.6% of the true
// value whatever the run's length, in fixed memory.
type histogram struct {
	counts [64 * 64]uint64
	total  uint64
}

const subBits = 6

func bucketOf(v uint64) int {
	if v < 1<<subBits {
		return int(v)
	}
	e := bits.Len64(v) - subBits - 1
	i := (e+1)<<subBits + int((v>>e)&(1<<subBits-1))
	return min(i, len(histogram{}.counts)-1)
}

// bucketLow is the smallest value counted in bucket i.
func bucketLow(i int) uint64 {
	if i < 1<<subBits {
		return uint64(i)
	}
	e := i>>subBits - 1
	return (1<<subBits | uint64(i&(1<<subBits-1))) << e
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(uint64(max(d, 0)))]++
	h.total++
}

func (h *histogram) merge(o *histogram) {
	for i, n := range o.counts {
		h.counts[i] += n
	}
	h.total += o.total
}

// quantile is the lower bound of the bucket holding the q-th value, q in (0,1].
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(q*float64(h.total) + 0.5)
	rank = max(rank, 1)
	var seen uint64
	for i, n := range h.counts {
		seen += n
		if seen >= rank {
			return time.Duration(bucketLow(i))
		}
	}
	return time.Duration(bucketLow(len(h.counts) - 1))
}
