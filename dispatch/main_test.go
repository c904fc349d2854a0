package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait for a condition: it only decides how long
// a broken test takes to fail, never whether a working one passes.
const waitTimeout = 20 * time.Second

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

// openStore opens a store on a real Redis with a fast probe, closed when
// the test ends, and waits until it is up.
func openStore(t *testing.T, r *redistest.Server) *store.Store {
	t.Helper()
	return openStoreProbing(t, r, 20*time.Millisecond)
}

// openStoreProbing is openStore with the probe interval given.
func openStoreProbing(t *testing.T, r *redistest.Server, every time.Duration) *store.Store {
	t.Helper()
	st, err := store.OpenStore(store.StoreOptions{RedisURL: r.URL(), ProbeInterval: every, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		redistest.WaitDelayedRefreshes(t)
	})
	waitFor(t, "redis to be up", st.Up)
	return st
}

// newDispatcher returns a dispatcher on st allowing inline limits, closed
// when the test ends.
func newDispatcher(t *testing.T, st *store.Store, cfg *policy.Config, log *zap.Logger) *Dispatcher {
	t.Helper()
	if log == nil {
		log = zaptest.NewLogger(t)
	}
	d := New(Options{Store: st, Config: cfg, AllowInline: true, Logger: log, KeyPrefix: "qt:"})
	t.Cleanup(d.Close)
	return d
}

// decide runs line through d and waits for its outcome.
func decide(t *testing.T, d *Dispatcher, line string) Outcome {
	t.Helper()
	var req protocol.Request
	if err := protocol.Decode([]byte(line), &req); err != nil {
		t.Fatalf("decode %s: %v", line, err)
	}
	done := make(chan struct{})
	dec := &Decision{Done: func() { close(done) }}
	if _, decided := d.Prepare(&req, dec); !decided {
		d.Run(dec)
	}
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatalf("%s: no outcome after %v", line, waitTimeout)
	}
	return dec.Out
}

func decodeReply(t testing.TB, line string) protocol.Reply {
	t.Helper()
	var r protocol.Reply
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("reply %q is not JSON: %v", line, err)
	}
	return r
}
