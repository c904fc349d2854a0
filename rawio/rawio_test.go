//go:build linux && !norawio

package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// unixPair returns both ends of a Unix socket connection.
func unixPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	client, err = net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestRawIOCarriesMoreThanTheSocketBuffersHold(t *testing.T) {
	a, b := unixPair(t)
	ra, rb := Wrap(a), Wrap(b)
	if _, ok := ra.(*rawConn); !ok {
		t.Fatalf("a Unix socket got %T, want raw reads and writes", ra)
	}
	// 8 MiB cannot sit in the socket's buffers: Write must wait for room
	// while the reader drains, and Read must wait for data.
	want := bytes.Repeat([]byte("0123456789abcdef"), 512<<10)
	werr := make(chan error, 1)
	go func() {
		_, err := ra.Write(want)
		if err == nil {
			err = a.(*net.UnixConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(rb)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(want))
	}
	// The peer's end of input is io.EOF, again and again.
	if n, err := rb.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("read after EOF = %d, %v", n, err)
	}
}

func TestRawIOHonoursDeadlinesAndClose(t *testing.T) {
	a, _ := unixPair(t)
	ra := Wrap(a)
	if err := ra.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := ra.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	if err := ra.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ra.Read(make([]byte, 8))
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // let the read wait on the poller
	ra.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a closed connection: %v, want net.ErrClosed", err)
	}
	if _, err := ra.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write on a closed connection: %v, want net.ErrClosed", err)
	}
}

func TestRawIOLeavesConnectionsWithoutADescriptorAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("net.Pipe got %T, want itself", got)
	}
}
