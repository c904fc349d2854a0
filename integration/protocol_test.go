package integration_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// TestBadLinesKeepTheConnection sends, on one connection, lines a buggy or
// hostile client might: each gets an error reply, blank lines get none, and
// the connection keeps answering in order.
func TestBadLinesKeepTheConnection(t *testing.T) {
	t.Parallel()
	const maxLine = 1024
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL(), "--max-line-bytes", fmt.Sprint(maxLine))
	c := sc.dial(t)

	// Malformed JSON.
	for i, line := range []string{
		`{"op":"take",`,
		`{"op":"ping"`,
		`{op:"ping"}`,
		`not json`,
		`[{"op":"ping"}]`,
		`"ping"`,
		`{"op":"ping","id":"x"} {"op":"ping"}`,
		`{"op":"ping","id":"unterminated}`,
	} {
		wantError(t, c.do(line), "INVALID")
		c.ping(fmt.Sprint("after-malformed-", i))
	}

	// Binary garbage, written before its newline.
	rng := rand.New(rand.NewPCG(1, 2))
	garbage := make([]byte, 512)
	for i := range garbage {
		garbage[i] = byte(rng.IntN(256))
		if garbage[i] == '\n' {
			garbage[i] = 0
		}
	}
	garbage[0] = 0xff // not blank, whatever the rest is
	c.write(garbage)
	c.write([]byte("\n"))
	wantError(t, c.read(), "INVALID")
	c.ping("after-garbage")

	// Invalid UTF-8 inside a string.
	c.write([]byte("{\"op\":\"ping\",\"id\":\"\xc3\x28\"}\n"))
	wantError(t, c.read(), "INVALID")
	c.ping("after-bad-utf8")

	// Lines around --max-line-bytes.
	pad := func(n int) string { // a valid ping of exactly n bytes
		head := `{"op":"ping","id":"fits","pad":"`
		return head + strings.Repeat("a", n-len(head)-2) + `"}`
	}
	rep := c.do(pad(maxLine))
	if !rep.ok() || rep.fields["id"] != "fits" {
		t.Fatalf("a ping of exactly %d bytes: got %s, want a ping reply", maxLine, rep)
	}
	c.write([]byte(pad(maxLine) + "\r\n")) // the terminator is not counted
	if rep := c.read(); !rep.ok() || rep.fields["id"] != "fits" {
		t.Fatalf("a ping of exactly %d bytes before CRLF: got %s, want a ping reply", maxLine, rep)
	}
	wantError(t, c.do(pad(maxLine+1)), "TOO_LARGE")
	c.ping("after-one-byte-too-many")
	wantError(t, c.do(pad(4*maxLine)), "TOO_LARGE")
	c.ping("after-oversized")
	wantError(t, c.do(pad(1<<20)), "TOO_LARGE")
	c.ping("after-a-megabyte")

	// Blank lines.
	c.send("", "   ", "\t", "\r", " \t\r")
	c.ping("after-blank")

	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestPipelinedRepliesComeBackInOrder writes 200 mixed requests in one write
// and reads 200 replies: one per request, in request order, blank lines
// ignored.
func TestPipelinedRepliesComeBackInOrder(t *testing.T) {
	t.Parallel()
	const n = 200
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	c := sc.dial(t)

	kind := func(i int) string { return [...]string{"take", "peek", "ping", "invalid"}[i%4] }
	var batch bytes.Buffer
	for i := range n {
		var line string
		switch kind(i) {
		case "take":
			line = fmt.Sprintf(`{"op":"take","id":%d,"subject":"pipe-%d","limit":1,"window_ms":60000}`, i, i)
		case "peek":
			line = fmt.Sprintf(`{"op":"peek","id":%d,"subject":"never-taken","limit":3,"window_ms":60000}`, i)
		case "ping":
			line = fmt.Sprintf(`{"op":"ping","id":%d}`, i)
		case "invalid":
			line = fmt.Sprintf(`{"op":"take","id":%d,"subject":"x","limit":"5","window_ms":60000}`, i)
		}
		batch.WriteString(line + "\n")
		if i%50 == 49 {
			batch.WriteString("\n") // no reply, so no shift in the ids
		}
	}
	// Write from another goroutine so that a sidecar pausing its reading
	// until replies drain cannot deadlock the test.
	written := make(chan error, 1)
	go func() { written <- c.writeErr(batch.Bytes()) }()

	for i := range n {
		rep := c.read()
		if got, want := rep.fields["id"], json.Number(fmt.Sprint(i)); got != want {
			t.Fatalf("reply %d has id %v, want %v: %s", i, got, want, rep)
		}
		switch kind(i) {
		case "take":
			wantTake(t, rep, true, false, 1, 1)
		case "peek":
			wantPeek(t, rep, 3, 0)
		case "ping":
			if !rep.ok() || rep.str(t, "store") != "redis" {
				t.Fatalf("reply %d: got %s, want a ping reply", i, rep)
			}
		case "invalid":
			wantError(t, rep, "INVALID")
		}
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	c.ping("after-batch")
	if keys := scanKeys(t, r, sc.prefix); len(keys) != n/4 {
		t.Fatalf("%d keys after %d takes on distinct subjects", len(keys), n/4)
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestReadyRepliesAreNotHeldBehindSlowOnes pipelines two pings behind a take
// that Redis holds: order is kept, but the pings' replies are sent while the
// take is still waiting, not when it finishes.
func TestReadyRepliesAreNotHeldBehindSlowOnes(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL(), "--redis-timeout", "60s")
	c := sc.dial(t)

	redisOK(t, r, "CLIENT", "PAUSE", "120000", "WRITE")
	t.Cleanup(func() { _ = r.Do(t, "CLIENT", "UNPAUSE").Error() })
	c.send(`{"op":"ping","id":"first"}`, `{"op":"ping","id":"second"}`,
		mustJSON(t, takeReq("held", 5, 60000, "id", "slow")))
	waitBlockedScript(t, r)
	for _, id := range []string{"first", "second"} {
		if rep := c.read(); !rep.ok() || rep.fields["id"] != id {
			t.Fatalf("got %s, want the ping %q", rep, id)
		}
	}
	if !scriptBlocked(t, r) {
		t.Fatal("the pings were answered only once the take had left Redis: ready replies wait behind a slow one")
	}
	redisOK(t, r, "CLIENT", "UNPAUSE")
	rep := c.read()
	if rep.fields["id"] != "slow" {
		t.Fatalf("got %s, want the take's reply", rep)
	}
	wantTake(t, rep, true, false, 5, 1)
	assertKeysHaveTTL(t, r, sc.prefix)
}
