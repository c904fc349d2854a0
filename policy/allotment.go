package policy

import (
	"math"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"quotad/limits"
)

// readAllotment reads a policy's allotment: block (docs/allotments.md),
// nil when absent. allotment: {} takes the defaults; a concurrency policy
// cannot have one.
func readAllotment(algo string, n yaml.Node, fail func(field, msg string) error) (*limits.Allotment, error) {
	if n.IsZero() {
		return nil, nil
	}
	if algo == limits.Concurrency {
		return nil, fail("allotment", "is not a field of "+algo+": a lease is held, not consumed, so there is nothing to reserve")
	}
	a := &limits.Allotment{SharePPM: limits.DefaultAllotmentSharePPM, IdleMS: limits.DefaultAllotmentIdleMS}
	if isNull(&n) {
		return a, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fail("allotment", "must be a mapping with max_share: and idle:, or {} for the defaults")
	}
	seen := map[string]bool{}
	for _, pair := range mappingPairs(&n) {
		k, v := pair[0], pair[1]
		if seen[k.Value] {
			return nil, fail("allotment", k.Value+": given twice")
		}
		seen[k.Value] = true
		switch k.Value {
		case "max_share":
			share, ok := shareField(v)
			if !ok {
				return nil, fail("allotment", "max_share: must be a number above 0 and at most 1, got "+quote(v.Value))
			}
			a.SharePPM = share
		case "idle":
			d, err := time.ParseDuration(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || d%time.Millisecond != 0 ||
				d.Milliseconds() < limits.MinAllotmentIdleMS || d.Milliseconds() > limits.MaxAllotmentIdleMS {
				return nil, fail("allotment", "idle: must be whole milliseconds "+limits.AllotmentIdleText+", got "+quote(v.Value))
			}
			a.IdleMS = d.Milliseconds()
		default:
			return nil, fail("allotment", "unknown field "+quote(k.Value)+didYouMean(k.Value, allotmentFields))
		}
	}
	return a, a.Validate()
}

var allotmentFields = []string{"max_share", "idle"}

// shareField reads max_share, a number in (0, 1], as parts per million,
// rounded to the nearest; a share that rounds to 0 is refused.
func shareField(n *yaml.Node) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!float" && n.Tag != "!!int" {
		return 0, false
	}
	f, err := strconv.ParseFloat(n.Value, 64)
	if err != nil || !(f > 0 && f <= 1) {
		return 0, false
	}
	ppm := int64(math.Round(f * limits.ShareScale))
	return ppm, ppm >= 1
}
