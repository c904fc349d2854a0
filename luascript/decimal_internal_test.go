package luascript

import (
	"strconv"
	"sync"
	"testing"
)

// decimal is strconv.FormatInt for every number, whichever numbers share a
// slot and however many goroutines format at once.
func TestDecimalIsFormatInt(t *testing.T) {
	nums := []int64{0, 1, 99, 100, 101, 10_000, 60_000, 86_400_000, MaxLimit, MaxWindowMS, 1<<53 - 1, -1, -100}
	for i := int64(0); i < 2000; i++ {
		nums = append(nums, 100+i*7919)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 3; round++ {
				for _, n := range nums {
					if got, want := decimal(n), strconv.FormatInt(n, 10); got != want {
						t.Errorf("decimal(%d) = %q, want %q", n, got, want)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// The numbers of one policy are formatted once: afterwards they cost no
// allocation.
func TestDecimalKeepsAPolicysNumbers(t *testing.T) {
	policy := []int64{10_000, 60_000, 86_400_000}
	for _, n := range policy {
		decimal(n)
	}
	allocs := testing.AllocsPerRun(100, func() {
		for _, n := range policy {
			decimal(n)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations to format a policy's numbers again, want 0", allocs)
	}
}
