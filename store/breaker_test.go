package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestDamperNeedsMoreProbesWhenTheBreakerFlaps(t *testing.T) {
	const every = time.Second
	d := damper{every: every}
	t0 := time.Unix(1_000_000, 0)

	// Redis unknown at start and found down: one good probe closes.
	d.opened(t0, false)
	if d.closeProbes() != 1 || !d.probeOK(t0.Add(every)) {
		t.Fatalf("a first outage: need %d probes, want 1 that closes", d.closeProbes())
	}
	closed := t0.Add(every)

	// Each reopening soon after a close doubles the probes needed, up to
	// maxCloseProbes.
	want := 1
	for i := range 8 {
		want = min(want*2, maxCloseProbes)
		at := closed.Add(every) // well within flapProbes intervals
		d.opened(at, true)
		if got := d.closeProbes(); got != want {
			t.Fatalf("reopening %d: need %d probes, want %d", i+1, got, want)
		}
		for p := 1; p < want; p++ {
			if d.probeOK(at.Add(time.Duration(p) * every)) {
				t.Fatalf("reopening %d: closed after %d of %d probes", i+1, p, want)
			}
		}
		closed = at.Add(time.Duration(want) * every)
		if !d.probeOK(closed) {
			t.Fatalf("reopening %d: still open after %d probes", i+1, want)
		}
	}

	// A failed probe restarts the count.
	d.opened(closed.Add(every), true)
	need := d.closeProbes()
	if need != maxCloseProbes {
		t.Fatalf("need %d, want the cap %d", need, maxCloseProbes)
	}
	for range need - 1 {
		d.probeOK(closed)
	}
	d.probeFailed()
	if d.probeOK(closed) {
		t.Fatal("closed right after a failed probe")
	}

	// An outage long after the last close is a new one: one probe again.
	d.opened(closed.Add(time.Hour), true)
	if d.closeProbes() != 1 {
		t.Fatalf("an outage long after the last: need %d probes, want 1", d.closeProbes())
	}
}

// Only the probe closes an open breaker: a call answered late, after the
// breaker opened, leaves it open and keeps the reason Redis is down.
func TestLateAnswerNeverClosesTheBreaker(t *testing.T) {
	st := &Store{kind: StoreRedis, log: zap.NewNop()}
	st.damper.every = time.Second
	st.setUp(true, true, nil)
	st.Observe("k", time.Time{}, HealthDown, errors.New("connection reset"))
	if st.Up() {
		t.Fatal("a transport error left the breaker closed")
	}
	st.Observe("k", time.Time{}, HealthUp, nil)
	if st.Up() || st.LastError() == nil {
		t.Fatalf("a late answer closed the breaker (up %v) or cleared why it opened (%v)", st.Up(), st.LastError())
	}
	st.setUp(true, true, nil)
	if !st.Up() || st.LastError() != nil {
		t.Fatalf("the probe did not close the breaker (up %v, last error %v)", st.Up(), st.LastError())
	}
}

// A call sent before the probe closed the breaker, which failed after the
// close, does not open it again: it tells how Redis was before, and
// counting it as a flap would double the probes the next close needs. A
// call sent after the close that fails opens it.
func TestFailureFromBeforeTheCloseNeverReopensTheBreaker(t *testing.T) {
	st := &Store{kind: StoreRedis, log: zap.NewNop()}
	st.damper.every = time.Second
	st.setUp(true, true, nil)
	sent := time.Now()
	st.Observe("k", sent, HealthDown, errors.New("connection reset"))
	if st.Up() {
		t.Fatal("a transport error left the breaker closed")
	}
	for !st.Up() {
		st.probed(nil)
	}
	st.Observe("k", sent, HealthDown, context.DeadlineExceeded)
	if !st.Up() || st.LastError() != nil {
		t.Fatalf("a call from before the close reopened the breaker (up %v, last error %v)", st.Up(), st.LastError())
	}
	st.Observe("k", time.Now(), HealthDown, context.DeadlineExceeded)
	if st.Up() {
		t.Fatal("a call sent after the close failed and left the breaker closed")
	}
}
