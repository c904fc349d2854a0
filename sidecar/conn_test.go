package sidecar

import (
	"io"
	"strings"
	"testing"
	"time"
)

// A client's lines may reach the reader in pieces, with the socket empty in
// between: the reader keeps what it has of a line while it waits, answers
// each whole line once, and skips an oversized line across the waits.
func TestLinesArrivingInPiecesAreAnsweredWhole(t *testing.T) {
	st := openStore(t, "")
	ts := startServer(t, Options{Store: st, AllowInline: true, MaxLineBytes: 200})
	c := ts.dial(t)
	waitRedisOK(t, c)

	take := `{"op":"take","id":1,"subject":"pieces","limit":5,"window_ms":60000}` + "\n"
	oversized := `{"op":"take","id":2,"subject":"` + strings.Repeat("x", 400) + `","limit":5,"window_ms":60000}` + "\n"
	peek := `{"op":"peek","id":3,"subject":"pieces","limit":5,"window_ms":60000}` + "\r\n"
	var pieces []string
	for _, line := range []string{take, oversized, peek} {
		for len(line) > 0 {
			n := min(len(line), 37)
			pieces = append(pieces, line[:n])
			line = line[n:]
		}
	}
	pieces = append(pieces, take[:len(take)-1], "\n") // the newline alone
	_ = c.nc.SetWriteDeadline(time.Now().Add(waitTimeout))
	for _, p := range pieces {
		if _, err := io.WriteString(c.nc, p); err != nil {
			t.Fatal(err)
		}
		// Long enough for the reader to empty the socket and wait for more.
		time.Sleep(2 * time.Millisecond)
	}

	for i, want := range []string{
		`{"id":1,"ok":true,"allowed":true,`,
		`{"ok":false,"error":"TOO_LARGE"`,
		`{"id":3,"ok":true,"limit":5,"used":1,`,
		`{"id":1,"ok":true,"allowed":true,`,
	} {
		if got := c.recvRaw(); !strings.HasPrefix(got, want) {
			t.Fatalf("reply %d = %s, want it to start %s", i+1, got, want)
		}
	}
	if rep := c.call(`{"op":"peek","subject":"pieces","limit":5,"window_ms":60000}`); rep.Used != 2 {
		t.Fatalf("after two takes the window holds %d, want 2", rep.Used)
	}
}
