package protocol_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"quotad/protocol"
)

// testServer is a Unix-socket server that hands each connection to handle.
type testServer struct {
	path string
	wg   sync.WaitGroup
}

// serve listens on a fresh socket and runs handle for every connection
// until the test ends; cleanup closes the listener and each connection and
// waits for the handlers.
func serve(t *testing.T, handle func(conn net.Conn)) *testServer {
	t.Helper()
	// A short directory: socket paths are limited to about 100 bytes.
	dir, err := os.MkdirTemp("", "qd")
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{path: filepath.Join(dir, "s")}
	l, err := net.Listen("unix", s.path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer conn.Close()
				handle(conn)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		s.wg.Wait()
		os.RemoveAll(dir)
	})
	return s
}

// replyServer answers each request line with reply(line); a nil reply
// sends nothing.
func replyServer(t *testing.T, reply func(line []byte) []byte) *testServer {
	return serve(t, func(conn net.Conn) {
		lr := protocol.NewLineReader(conn, 256, 1<<16)
		for {
			line, err := lr.ReadLine()
			if err != nil {
				return
			}
			if out := reply(line); out != nil {
				if _, err := conn.Write(out); err != nil {
					return
				}
			}
		}
	})
}

// canned answers like a sidecar with fixed numbers: a take is allowed with
// used = cost, a peek shows nothing used, a bad request gets its error.
func canned(line []byte) []byte {
	var r protocol.Request
	if err := protocol.Decode(line, &r); err != nil {
		return protocol.AppendErr(nil, r.ID, err)
	}
	switch r.Op {
	case protocol.OpTake:
		if r.RequestID == "conflict" {
			return protocol.AppendError(nil, r.ID, protocol.CodeConflict, "request_id was accepted with cost 2")
		}
		return protocol.AppendTake(nil, r.ID, protocol.TakeReply{
			Allowed: true, Limit: r.Limit, Used: r.Cost, Remaining: r.Limit - r.Cost, ResetMS: r.WindowMS,
		})
	case protocol.OpPeek:
		return protocol.AppendPeek(nil, r.ID, protocol.PeekReply{Limit: r.Limit, Remaining: r.Limit})
	default:
		return protocol.AppendPing(nil, r.ID, protocol.PingReply{Store: "embedded", Version: "test"})
	}
}

func dial(t *testing.T, s *testServer) *protocol.Client {
	t.Helper()
	c, err := protocol.Dial(context.Background(), s.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestClientDo(t *testing.T) {
	got := make(chan []byte, 1)
	s := serve(t, func(conn net.Conn) {
		buf := make([]byte, 64)
		var req []byte
		for !bytes.HasSuffix(req, []byte("\n")) {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			req = append(req, buf[:n]...)
		}
		got <- req
		conn.Write([]byte(`{"id":"a","ok":true,"store":"redis","redis_ok":true,"version":"v1"}` + "\r\n"))
	})
	c := dial(t, s)
	reply, err := c.Do(context.Background(), []byte(`{"op":"ping","id":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	if req := <-got; string(req) != `{"op":"ping","id":"a"}`+"\n" {
		t.Errorf("server got %q, want the line and one newline", req)
	}
	if want := `{"id":"a","ok":true,"store":"redis","redis_ok":true,"version":"v1"}`; string(reply) != want {
		t.Errorf("Do = %q, want %q", reply, want)
	}
}

func TestClientCall(t *testing.T) {
	c := dial(t, replyServer(t, canned))
	ctx := context.Background()
	tests := []struct {
		name    string
		req     any
		want    protocol.Reply
		wantRaw string
	}{
		{
			name:    "take",
			req:     map[string]any{"op": "take", "id": 7, "subject": "alice", "limit": 5, "window_ms": 60000, "cost": 2},
			want:    protocol.Reply{ID: []byte("7"), OK: true, Allowed: true, Limit: 5, Used: 2, Remaining: 3, ResetMS: 60000},
			wantRaw: `{"id":7,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60000,"retry_after_ms":0}`,
		},
		{
			name:    "peek",
			req:     map[string]any{"op": "peek", "subject": "bob", "limit": 3, "window_ms": 1000},
			want:    protocol.Reply{OK: true, Limit: 3, Remaining: 3},
			wantRaw: `{"ok":true,"limit":3,"used":0,"remaining":3,"reset_ms":0}`,
		},
		{
			name: "ping with string id",
			req: struct {
				Op string `json:"op"`
				ID string `json:"id"`
			}{Op: "ping", ID: "p"},
			want:    protocol.Reply{ID: []byte(`"p"`), OK: true, Store: "embedded", Version: "test"},
			wantRaw: `{"id":"p","ok":true,"store":"embedded","redis_ok":false,"version":"test","ready":false}`,
		},
		{
			name:    "error reply",
			req:     map[string]any{"op": "take", "id": "x", "subject": "s", "limit": 5, "window_ms": 10, "request_id": "conflict"},
			want:    protocol.Reply{ID: []byte(`"x"`), Error: protocol.CodeConflict, Message: "request_id was accepted with cost 2"},
			wantRaw: `{"id":"x","ok":false,"error":"CONFLICT","message":"request_id was accepted with cost 2"}`,
		},
		{
			name:    "invalid request",
			req:     map[string]any{"op": "launch", "id": 1},
			want:    protocol.Reply{ID: []byte("1"), Error: protocol.CodeInvalid, Message: `unknown op "launch": one of take, peek, release, settle, ping`},
			wantRaw: `{"id":1,"ok":false,"error":"INVALID","message":"unknown op \"launch\": one of take, peek, release, settle, ping"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, raw, err := c.Call(ctx, tt.req)
			if err != nil {
				t.Fatalf("Call: %v", err)
			}
			if string(raw) != tt.wantRaw {
				t.Errorf("raw reply\n got %s\nwant %s", raw, tt.wantRaw)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tt.want) {
				t.Errorf("reply\n got %+v\nwant %+v", got, tt.want)
			}
			if tt.want.OK {
				if got.Err() != nil {
					t.Errorf("Err() = %v for an ok reply", got.Err())
				}
				return
			}
			if err := got.Err(); !errors.Is(err, &protocol.Error{Code: tt.want.Error}) {
				t.Errorf("Err() = %v, want code %s", err, tt.want.Error)
			}
		})
	}
}

// A reply may arrive a byte at a time; a returned line is the caller's and
// is not overwritten by the next call.
func TestClientSlowReplies(t *testing.T) {
	s := replyServer(t, canned)
	// A relay in front of it writes each reply byte by byte.
	slow := serve(t, func(conn net.Conn) {
		up, err := net.Dial("unix", s.path)
		if err != nil {
			return
		}
		copied := make(chan struct{})
		defer func() {
			up.Close()
			conn.Close()
			<-copied
		}()
		go func() {
			defer close(copied)
			io.Copy(up, conn)
			up.Close()
		}()
		b := make([]byte, 1)
		for {
			if _, err := up.Read(b); err != nil {
				return
			}
			if _, err := conn.Write(b); err != nil {
				return
			}
		}
	})
	c := dial(t, slow)
	first, err := c.Do(context.Background(), []byte(`{"op":"ping","id":1}`))
	if err != nil {
		t.Fatal(err)
	}
	keep := string(first)
	second, err := c.Do(context.Background(), []byte(`{"op":"ping","id":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(first) != keep || !strings.HasPrefix(keep, `{"id":1,`) || !strings.HasPrefix(string(second), `{"id":2,`) {
		t.Errorf("replies %q then %q", first, second)
	}
}

// Calls from many goroutines are serialised: each gets its own reply.
func TestClientConcurrentCalls(t *testing.T) {
	c := dial(t, replyServer(t, canned))
	var wg sync.WaitGroup
	errs := make(chan error, 8*25)
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				id := fmt.Sprintf(`"g%d-%d"`, g, i)
				r, _, err := c.Call(context.Background(), map[string]any{"op": "ping", "id": strings.Trim(id, `"`)})
				if err != nil {
					errs <- err
					return
				}
				if string(r.ID) != id {
					errs <- fmt.Errorf("sent id %s, reply has %s", id, r.ID)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestClientBadReply(t *testing.T) {
	c := dial(t, replyServer(t, func([]byte) []byte { return []byte("not json\n") }))
	_, raw, err := c.Call(context.Background(), map[string]string{"op": "ping"})
	if err == nil {
		t.Fatal("Call accepted a reply that is not JSON")
	}
	if string(raw) != "not json" {
		t.Errorf("raw = %q, want the reply line", raw)
	}
}

func TestClientEncodeError(t *testing.T) {
	requests := make(chan []byte, 1)
	c := dial(t, replyServer(t, func(line []byte) []byte {
		requests <- bytes.Clone(line)
		return canned(line)
	}))
	if _, _, err := c.Call(context.Background(), map[string]any{"op": make(chan int)}); err == nil {
		t.Fatal("Call of an unencodable request succeeded")
	}
	// Nothing was sent: the next call gets its own reply.
	r, _, err := c.Call(context.Background(), map[string]any{"op": "ping", "id": 5})
	if err != nil || string(r.ID) != "5" {
		t.Fatalf("next Call = %+v, %v", r, err)
	}
	if got := <-requests; !bytes.Contains(got, []byte(`"id":5`)) {
		t.Errorf("server first got %q", got)
	}
}

// A line holding a newline would be two requests and two replies, and every
// later reply would go to the wrong call; Do refuses it and sends nothing.
func TestClientRejectsNewlineInLine(t *testing.T) {
	c := dial(t, replyServer(t, canned))
	if _, err := c.Do(context.Background(), []byte("{\"op\":\"ping\",\"id\":1}\n{\"op\":\"ping\",\"id\":2}")); err == nil {
		t.Fatal("Do sent a line with a newline in it")
	}
	reply, err := c.Do(context.Background(), []byte(`{"op":"ping","id":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(reply, []byte(`{"id":3,`)) {
		t.Errorf("reply %q, want the reply to id 3", reply)
	}
}

func TestClientServerCloses(t *testing.T) {
	c := dial(t, serve(t, func(conn net.Conn) {
		protocol.NewLineReader(conn, 64, 1024).ReadLine()
	}))
	_, err := c.Do(context.Background(), []byte(`{"op":"ping"}`))
	if !errors.Is(err, io.EOF) {
		t.Errorf("Do on a closed connection = %v, want io.EOF", err)
	}
}

func TestClientReplyTooLarge(t *testing.T) {
	huge := append(bytes.Repeat([]byte("x"), 1<<20+1), '\n')
	c := dial(t, replyServer(t, func([]byte) []byte { return huge }))
	_, err := c.Do(context.Background(), []byte(`{"op":"ping"}`))
	if !errors.Is(err, protocol.ErrTooLarge) {
		t.Errorf("Do = %v, want ErrTooLarge", err)
	}
}

func TestDialError(t *testing.T) {
	_, err := protocol.Dial(context.Background(), filepath.Join(t.TempDir(), "none"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dial of a missing socket = %v, want os.ErrNotExist", err)
	}
}

// holdServer reads requests and holds their replies until the test releases
// them, announcing each request it reads.
type holdServer struct {
	*testServer
	got     chan []byte
	release chan []byte
}

func newHoldServer(t *testing.T) *holdServer {
	h := &holdServer{got: make(chan []byte, 10), release: make(chan []byte, 10)}
	stop := make(chan struct{})
	h.testServer = serve(t, func(conn net.Conn) {
		lr := protocol.NewLineReader(conn, 256, 1<<16)
		for {
			line, err := lr.ReadLine()
			if err != nil {
				return
			}
			h.got <- bytes.Clone(line)
			select {
			case reply := <-h.release:
				if _, err := conn.Write(reply); err != nil {
					return
				}
			case <-stop:
				return
			}
		}
	})
	// Registered after serve's cleanup, so it runs first and frees a
	// handler still holding a reply.
	t.Cleanup(func() { close(stop) })
	return h
}

// After a call fails mid-exchange, its reply may still arrive. A client
// that went on would hand that stale reply to the next call, so the
// connection is closed and later calls fail.
func TestClientTimeoutDoesNotDesync(t *testing.T) {
	h := newHoldServer(t)
	c := dial(t, h.testServer)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Do(ctx, []byte(`{"op":"ping","id":1}`))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do past its deadline = %v, want context.DeadlineExceeded", err)
	}
	<-h.got
	h.release <- []byte(`{"id":1,"ok":true,"store":"redis","redis_ok":true,"version":"stale"}` + "\n")

	reply, err := c.Do(context.Background(), []byte(`{"op":"ping","id":2}`))
	if err == nil {
		t.Fatalf("Do after a timed-out call returned %q, want an error", reply)
	}
	if !errors.Is(err, net.ErrClosed) {
		t.Errorf("Do after a timed-out call = %v, want net.ErrClosed", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do after a timed-out call = %v, which reads as its own timeout", err)
	}
}

// Cancelling a context without a deadline stops a call that waits for its
// reply.
func TestClientCancel(t *testing.T) {
	h := newHoldServer(t)
	c := dial(t, h.testServer)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, []byte(`{"op":"ping"}`))
		done <- err
	}()
	<-h.got
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Do = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		h.release <- []byte("{\"ok\":true}\n")
		<-done
		t.Fatal("Do ignored the cancellation of its context")
	}
}

// A call whose context is already done sends nothing and leaves the client
// usable.
func TestClientContextAlreadyDone(t *testing.T) {
	h := newHoldServer(t)
	c := dial(t, h.testServer)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Do(ctx, []byte(`{"op":"ping","id":1}`)); !errors.Is(err, context.Canceled) {
		t.Errorf("Do with a cancelled context = %v, want context.Canceled", err)
	}
	h.release <- []byte(`{"id":2,"ok":true}` + "\n")
	// The timeout only turns a hang into a failure.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply, err := c.Do(ctx, []byte(`{"op":"ping","id":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := <-h.got; string(got) != `{"op":"ping","id":2}` {
		t.Errorf("server first got %q", got)
	}
	if string(reply) != `{"id":2,"ok":true}` {
		t.Errorf("reply %q", reply)
	}
}

// A deadline that has not passed bounds the call but does not break it, and
// a cancellation after the reply has no effect on the next call.
func TestClientDeadlineMet(t *testing.T) {
	c := dial(t, replyServer(t, canned))
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		reply, err := c.Do(ctx, fmt.Appendf(nil, `{"op":"ping","id":%d}`, i))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(reply, fmt.Appendf(nil, `{"id":%d,`, i)) {
			t.Errorf("reply %q", reply)
		}
	}
}

func TestClientClose(t *testing.T) {
	c := dial(t, replyServer(t, canned))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(context.Background(), []byte(`{"op":"ping"}`)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Do after Close = %v, want net.ErrClosed", err)
	}
}
