package redistest

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// delayedRefresh is the function of the goroutine a failed rueidis.NewClient
// leaves behind. Before falling back to a single-node client, NewClient
// probes the address as a cluster; when the dial fails, the probe's close
// hook schedules a topology refresh through singleflight DelayDo, which
// sleeps a random delay of up to one second (clusterRefreshAutoMaxDelay for
// fewer than 100 nodes), finds no connection to refresh and returns. The
// client that owns it was never returned, so closing the store cannot stop
// it: it is slow to exit, not leaked. goleak's own retries span about 0.4s,
// so the tests of a store that could not connect wait for it here, and a
// refresh still sleeping after 20 s fails the test as the leak it would be.
const delayedRefresh = "github.com/redis/rueidis.(*call).DelayDo.func1"

// WaitDelayedRefreshes waits for the rueidis refresh goroutines a failed
// connection attempt left behind to end.
func WaitDelayedRefreshes(t testing.TB) {
	t.Helper()
	const wait = 20 * time.Second
	deadline := time.Now().Add(wait)
	for {
		stacks := AllStacks()
		if !strings.Contains(stacks, delayedRefresh) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("rueidis refresh goroutines still running %v after the store closed:\n%s", wait, stacks)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AllStacks is every goroutine's stack, for failure messages.
func AllStacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}
