package sidecar

import (
	"io"
	"net"
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

// A client that sends its last lines and shuts its side at once gets every
// reply and then the end of the connection, also when its end of input
// reaches the reader together with the data: after a final line without a
// newline, after a last line it reads the reply to, and after blank lines.
func TestEndOfInputWithTheLastLinesClosesTheConnection(t *testing.T) {
	st := openStore(t, "")
	ts := startServer(t, Options{Store: st, AllowInline: true})
	waitRedisOK(t, ts.dial(t))
	for _, tc := range []struct {
		name, send string
		replies    int
	}{
		{"no final newline", `{"op":"ping","id":1}`, 1},
		{"final newline", `{"op":"ping","id":1}` + "\n", 1},
		{"take", `{"op":"take","id":1,"subject":"eof","limit":1000,"window_ms":60000}` + "\n", 1},
		{"two lines", `{"op":"ping","id":1}` + "\n" + `{"op":"ping","id":2}` + "\n", 2},
		{"blank lines", "\n \n", 0},
		{"nothing", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 {
				c := ts.dial(t)
				_ = c.nc.SetDeadline(time.Now().Add(waitTimeout))
				// One write and the shutdown right after it, so that both
				// are usually in the socket before the reader wakes.
				if _, err := io.WriteString(c.nc, tc.send); err != nil {
					t.Fatal(err)
				}
				if err := c.nc.(*net.UnixConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				rest, err := io.ReadAll(c.nc) // to the end of the connection
				if err != nil {
					t.Fatalf("the sidecar did not close the connection after the client's end of input: %v (read %q)", err, rest)
				}
				if n := strings.Count(string(rest), "\n"); n != tc.replies {
					t.Fatalf("got %d replies (%q), want %d", n, rest, tc.replies)
				}
				c.nc.Close()
			}
		})
	}
}
