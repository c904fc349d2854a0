package store

import (
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"quotad/integration/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait for a condition. It is far above what any
// condition needs on a loaded machine: it only decides how long a broken test
// takes to fail, never whether a working one passes.
const waitTimeout = 20 * time.Second

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openStore opens a store on url ("" for the embedded one) and closes it when
// the test ends. The probe runs often so that health changes show quickly.
func openStore(t *testing.T, url string) *Store {
	t.Helper()
	return openStoreTimeout(t, url, time.Second)
}

// openStoreTimeout is openStore with the probe's deadline set.
func openStoreTimeout(t *testing.T, url string, timeout time.Duration) *Store {
	t.Helper()
	st, err := OpenStore(StoreOptions{
		RedisURL:      url,
		Timeout:       timeout,
		ProbeInterval: 20 * time.Millisecond,
		Logger:        zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatalf("OpenStore(%q): %v", url, err)
	}
	t.Cleanup(func() {
		st.Close()
		redistest.WaitDelayedRefreshes(t)
	})
	return st
}
