package sidecar

import (
	"context"
	"testing"
	"time"
)

func TestSharedDeadlineIsNeverLaterThanTheTimeout(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	const timeout = time.Hour
	d := newSharedDeadline(parent, timeout)
	start := time.Now()
	first := d.get(start)
	// Requests within the share window get the same context.
	if d.get(start.Add(d.share-time.Nanosecond)) != first {
		t.Fatal("a request within the share window got a context of its own")
	}
	later := start.Add(d.share)
	second := d.get(later)
	if second == first {
		t.Fatal("a request after the share window reused an older context")
	}
	for _, c := range []struct {
		ctx context.Context
		at  time.Time
	}{{first, start}, {second, later}} {
		dl, ok := c.ctx.Deadline()
		if !ok || dl.After(c.at.Add(timeout)) || dl.Before(c.at.Add(timeout-d.share)) {
			t.Fatalf("deadline %v for a request at %v: want within [timeout-share, timeout] of it", dl, c.at)
		}
	}
	// At most a thousand contexts are alive over one timeout.
	if n := timeout / d.share; n > 1000 {
		t.Fatalf("share %v lets %d contexts live at once", d.share, n)
	}
	// Cancelling the parent (Shutdown running out of time) ends them all.
	cancel()
	if first.Err() == nil || second.Err() == nil {
		t.Fatal("cancelling the server's request context did not reach shared contexts")
	}
}

func TestCallContextSharesOnlyTheServersOwnDeadline(t *testing.T) {
	s := NewServer(Options{RedisTimeout: time.Second})
	// A context other than the server's own never shares.
	other, cancelOther := s.callContext(context.Background(), time.Second)
	defer cancelOther()
	defer s.Close()
	a, cancelA := s.callContext(s.reqCtx, time.Second)
	defer cancelA()
	if dl, ok := a.Deadline(); !ok || time.Until(dl) > time.Second {
		t.Fatalf("deadline %v, want at most 1s away", dl)
	}
	if a != s.deadlines.cur.Load().ctx {
		t.Fatal("a call with the server's own timeout did not get the shared context")
	}
	own, cancelOwn := s.callContext(s.reqCtx, 50*time.Millisecond)
	defer cancelOwn()
	if own == a {
		t.Fatal("a request's shorter timeout_ms shared the server's deadline")
	}
	if other == a || s.deadlines.cur.Load().ctx == other {
		t.Fatal("a call under another parent context shared the server's")
	}
	if dl, _ := own.Deadline(); time.Until(dl) > 50*time.Millisecond {
		t.Fatalf("timeout_ms 50 got a deadline %v away", time.Until(dl))
	}
}
