package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"quotad/protocol"
)

// kind is what a take's reply says happened to it.
type kind int

const (
	kindDecided kind = iota // allowed or denied by Redis
	kindTimeout             // "redis did not answer in time": outcome unknown
	kindUnknown             // another UNAVAILABLE whose outcome is unknown (a lost connection)
	kindWaited              // "did not answer earlier calls within the deadline": not run
	kindBreaker             // "breaker open": not run
	kindNotRun              // another UNAVAILABLE that was not run (not connected)
	kindOther               // any other error reply
	kinds
)

var kindNames = [kinds]string{"decided", "timeout (unknown)", "other unknown", "waited (not run)", "breaker (not run)", "other not run", "other error"}

func classify(r *protocol.Reply) kind {
	switch {
	case r.OK:
		return kindDecided
	case r.Error != protocol.CodeUnavailable:
		return kindOther
	case strings.Contains(r.Message, "breaker open"):
		return kindBreaker
	case strings.Contains(r.Message, "did not answer in time"):
		return kindTimeout
	case strings.Contains(r.Message, "earlier calls within the deadline"):
		return kindWaited
	case strings.Contains(r.Message, "not run"):
		return kindNotRun
	default:
		return kindUnknown
	}
}

// take is one take the load sent and what came back.
type take struct {
	subject int
	rid     string
	sent    time.Time
	got     time.Time // zero when no reply came
	kind    kind
	reply   protocol.Reply
}

// load is the workload: pipelining clients taking from a fixed window per
// subject, small enough that subjects reach their limit during a run, so
// that an over-admission would show.
type load struct {
	socket   string
	conns    int
	inflight int
	subjects int
	limit    int64
	windowMS int64
}

// line is a take's request line, without its newline.
func (l *load) line(subject int, rid string) []byte {
	return fmt.Appendf(nil, `{"op":"take","subject":"fb-%d","limit":%d,"window_ms":%d,"request_id":%q}`,
		subject, l.limit, l.windowMS, rid)
}

// run keeps l.inflight takes outstanding on each of l.conns connections
// until ctx is done, then waits for the replies still owed, and returns
// every take sent.
func (l *load) run(ctx context.Context, runID string) ([]take, error) {
	const replyWait = 30 * time.Second
	out := make([][]take, l.conns)
	errs := make([]error, l.conns)
	var wg sync.WaitGroup
	for ci := range l.conns {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", l.socket)
		if err != nil {
			return nil, fmt.Errorf("connect to quotad: %w", err)
		}
		wg.Go(func() {
			defer nc.Close()
			rng := rand.New(rand.NewPCG(uint64(ci), uint64(len(runID))))
			// The reader holds one take while it waits for its reply.
			pending := make(chan take, l.inflight-1)
			var mine []take
			done := make(chan struct{})
			go func() {
				defer close(done)
				sc := bufio.NewScanner(nc)
				sc.Buffer(make([]byte, 64<<10), 1<<20)
				for tk := range pending {
					_ = nc.SetReadDeadline(time.Now().Add(replyWait))
					if !sc.Scan() {
						errs[ci] = fmt.Errorf("read a reply: %v", sc.Err())
						mine = append(mine, tk)
						for tk := range pending {
							mine = append(mine, tk)
						}
						return
					}
					tk.got = time.Now()
					if err := json.Unmarshal(sc.Bytes(), &tk.reply); err != nil {
						errs[ci] = fmt.Errorf("reply %q: %w", sc.Bytes(), err)
					}
					tk.kind = classify(&tk.reply)
					mine = append(mine, tk)
				}
			}()
			for n := 0; ctx.Err() == nil; n++ {
				tk := take{subject: rng.IntN(l.subjects), rid: fmt.Sprintf("%s-%d-%d", runID, ci, n)}
				tk.sent = time.Now()
				stop := false
				select {
				case pending <- tk:
				case <-ctx.Done():
					stop = true
				}
				if stop {
					break
				}
				if _, err := nc.Write(append(l.line(tk.subject, tk.rid), '\n')); err != nil {
					errs[ci] = fmt.Errorf("write a take: %w", err)
					break
				}
			}
			close(pending)
			<-done
			out[ci] = mine
		})
	}
	wg.Wait()
	var all []take
	for _, m := range out {
		all = append(all, m...)
	}
	for _, err := range errs {
		if err != nil {
			return all, err
		}
	}
	return all, nil
}
