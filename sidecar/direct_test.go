package sidecar

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
)

// A request that comes when every earlier reply is on the socket has its
// reply written by the goroutine that decides it (conn.place, writeHere).
// A client that sends requests one by one without reading fills its
// socket: the reply that no longer fits is finished by the writer, and
// every later one waits for it. Read at last, the replies are whole and in
// request order.
func TestRepliesStayWholeAndInOrderWhenTheSocketFills(t *testing.T) {
	r := redistest.Start(t)
	const n = 1000 // far more replies than the socket holds
	ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true, MaxInflightPerConn: n})
	c := ts.dial(t)
	waitRedisOK(t, c)
	pad := strings.Repeat("p", 100)
	for i := range n {
		c.send(inlineTake(strconv.Itoa(i)+"-"+pad, "fill", 1_000_000, ""))
		// The next request comes once this one is answered, so that it
		// finds the socket as this one's reply left it: written, or, once
		// the socket is full, waiting.
		deadline := time.Now().Add(waitTimeout)
		for metricValue(t, ts.Server, "quotad_requests_total", map[string]string{"op": "take"}) < float64(i+1) {
			if time.Now().After(deadline) {
				t.Fatalf("take %d was not answered within %v", i, waitTimeout)
			}
			time.Sleep(20 * time.Microsecond)
		}
		for settle := time.Now().Add(2 * time.Millisecond); ts.queueLens()[0] > 0 && time.Now().Before(settle); {
			time.Sleep(20 * time.Microsecond)
		}
	}
	// Small writes fill a socket's buffer long before n replies.
	if waiting := ts.queueLens(); len(waiting) != 1 || waiting[0] < n/2 {
		t.Fatalf("replies waiting for the socket: %v, want more than %d", waiting, n/2)
	}
	for i := range n {
		raw := c.recvRaw()
		got := decodeReply(t, raw)
		if want := `"` + strconv.Itoa(i) + "-" + pad + `"`; string(got.ID) != want || !got.OK || !got.Allowed || got.Used != int64(i+1) {
			t.Fatalf("reply %d = %.200s…; want take %d allowed with used %d", i, raw, i, i+1)
		}
	}
}
