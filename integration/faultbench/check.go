package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"quotad/protocol"
)

// maxReplays bounds how many accepted takes the replay check sends again,
// and maxNotRun how many of the takes answered "not run" it sends again to
// see that they were not.
const (
	maxReplays = 500
	maxNotRun  = 500
)

// check verifies, once the faults are gone, what quotad promises under any
// of them: no subject accepted more than its limit (counting the takes
// whose outcome was unknown, sent again with their request ids), every
// accepted take replays exactly, and no key lacks a TTL. It returns the
// violations found; none is the expected result today.
func (e *env) check(ctx context.Context, l *load, takes []take) ([]string, error) {
	var bad []string
	c, err := protocol.Dial(ctx, e.socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// send sends a take again until it gets an answer that is not
	// UNAVAILABLE: the breaker may open again for a while after a fault
	// (a late reply, the flap damping), and a request id makes resending
	// safe.
	send := func(tk *take) (protocol.Reply, error) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			raw, err := c.Do(callCtx, l.line(tk.subject, tk.rid))
			cancel()
			if err != nil {
				return protocol.Reply{}, err
			}
			var r protocol.Reply
			if err := json.Unmarshal(raw, &r); err != nil {
				return r, err
			}
			if r.OK || r.Error != protocol.CodeUnavailable || time.Now().After(deadline) {
				return r, nil
			}
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	accepted := make(map[int]int64)
	replays := 0
	for i := range takes {
		tk := &takes[i]
		if tk.kind != kindDecided || !tk.reply.Allowed {
			continue
		}
		if !tk.reply.Replay {
			accepted[tk.subject]++
		}
		if replays >= maxReplays {
			continue
		}
		replays++
		r, err := send(tk)
		if err != nil {
			return bad, fmt.Errorf("replay %s: %w", tk.rid, err)
		}
		if !r.OK || !r.Allowed || !r.Replay || r.Used != tk.reply.Used {
			bad = append(bad, fmt.Sprintf("take %s accepted with used %d replays as %+v", tk.rid, tk.reply.Used, r))
		}
	}
	// A take whose outcome is unknown may have been applied: sent again
	// with its request id, it replays if it was, and is decided now if not.
	// One answered "not run" must not replay.
	notRun := 0
	for i := range takes {
		tk := &takes[i]
		switch tk.kind {
		case kindDecided, kindOther:
			continue
		case kindWaited, kindBreaker, kindNotRun:
			if notRun++; notRun > maxNotRun {
				continue
			}
		}
		r, err := send(tk)
		if err != nil {
			return bad, fmt.Errorf("retry %s: %w", tk.rid, err)
		}
		switch {
		case !r.OK:
			bad = append(bad, fmt.Sprintf("retry of %s after the fault: %s %s", tk.rid, r.Error, r.Message))
		case r.Allowed:
			accepted[tk.subject]++
		}
		if r.OK && r.Replay && (tk.kind == kindWaited || tk.kind == kindBreaker || tk.kind == kindNotRun) {
			bad = append(bad, fmt.Sprintf("take %s answered %q was run", tk.rid, tk.reply.Message))
		}
	}
	for s, n := range accepted {
		if n > l.limit {
			bad = append(bad, fmt.Sprintf("subject fb-%d accepted %d takes, limit %d", s, n, l.limit))
		}
	}

	var cursor uint64
	for {
		res, err := e.rc.Do(ctx, e.rc.B().Scan().Cursor(cursor).Match(keyPrefix+"*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			return bad, fmt.Errorf("scan: %w", err)
		}
		for _, k := range res.Elements {
			ttl, err := e.rc.Do(ctx, e.rc.B().Pttl().Key(k).Build()).AsInt64()
			if err != nil {
				return bad, fmt.Errorf("pttl %s: %w", k, err)
			}
			if ttl == -1 {
				bad = append(bad, "key "+strconv.Quote(k)+" has no TTL")
			}
		}
		if cursor = res.Cursor; cursor == 0 {
			break
		}
	}
	return bad, nil
}
