package sidecar

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// shortDir is a temporary directory whose paths fit in sun_path.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// pathOfLen is a path in dir of exactly n bytes.
func pathOfLen(t *testing.T, dir string, n int) string {
	t.Helper()
	pad := n - len(dir) - 1
	if pad < 1 {
		t.Fatalf("temporary directory %s is too long for a %d-byte path", dir, n)
	}
	return filepath.Join(dir, strings.Repeat("s", pad))
}

// listen calls Listen and closes the listener when the test ends.
func listen(t *testing.T, path string, mode os.FileMode) net.Listener {
	t.Helper()
	l, err := Listen(path, mode)
	if err != nil {
		t.Fatalf("Listen(%s): %v", path, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// answers reports whether a client can connect to the socket at path.
func answers(path string) bool {
	nc, err := net.Dial("unix", path)
	if err != nil {
		return false
	}
	nc.Close()
	return true
}

func TestListenPathLength(t *testing.T) {
	dir := shortDir(t)
	// sun_path holds 108 bytes with the terminating NUL.
	listen(t, pathOfLen(t, dir, 107), 0o600)
	long := pathOfLen(t, dir, 108)
	if _, err := Listen(long, 0o600); err == nil || !strings.Contains(err.Error(), "107") {
		t.Fatalf("Listen with a 108-byte path = %v, want an error naming the 107-byte limit", err)
	}
	if _, err := os.Lstat(long); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused path was created: %v", err)
	}
}

func TestListenMissingDirectory(t *testing.T) {
	dir := filepath.Join(shortDir(t), "missing")
	_, err := Listen(filepath.Join(dir, "q.sock"), 0o600)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "--socket") {
		t.Fatalf("Listen in a missing directory = %v, want a not-exist error naming --socket", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Listen created the missing directory: %v", err)
	}
}

func TestListenLeavesARegularFileAlone(t *testing.T) {
	path := filepath.Join(shortDir(t), "q.sock")
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path, 0o600); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Listen on a regular file = %v, want an error saying it is not a socket", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
		t.Fatalf("the regular file was changed: %q, %v", b, err)
	}
}

func TestListenLeavesADirectoryAlone(t *testing.T) {
	path := filepath.Join(shortDir(t), "q.sock")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path, 0o600); err == nil {
		t.Fatal("Listen on a directory succeeded")
	}
	if st, err := os.Stat(path); err != nil || !st.IsDir() {
		t.Fatalf("the directory was changed: %v", err)
	}
}

func TestListenRefusesALiveSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "q.sock")
	first := listen(t, path, 0o600)
	if _, err := Listen(path, 0o600); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("Listen on a live socket = %v, want an error saying another process serves it", err)
	}
	// The first listener still owns the path and accepts on it.
	accepted := make(chan error, 1)
	go func() {
		nc, err := first.Accept()
		if err == nil {
			nc.Close()
		}
		accepted <- err
	}()
	if !answers(path) {
		t.Fatal("the first listener's socket no longer answers")
	}
	// Listen's own probe may be the connection accepted first.
	if err := <-accepted; err != nil {
		t.Fatalf("first listener: %v", err)
	}
}

func TestListenReplacesAStaleSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "q.sock")
	// What a sidecar that was killed leaves behind: a socket file nobody
	// listens on.
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	old.SetUnlinkOnClose(false)
	old.Close()
	if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeSocket == 0 || answers(path) {
		t.Fatalf("setup: want a stale socket file at %s (%v)", path, err)
	}

	l := listen(t, path, 0o600)
	if !answers(path) {
		t.Fatal("the socket that replaced the stale one does not answer")
	}
	l.Close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file after Close: %v, want it removed", err)
	}
}

func TestListenAppliesTheMode(t *testing.T) {
	dir := shortDir(t)
	for i, mode := range []os.FileMode{0o600, 0o660, 0o666} {
		path := filepath.Join(dir, "q"+strconv.Itoa(i)+".sock")
		listen(t, path, mode)
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != mode {
			t.Errorf("socket %s has mode %v, want a socket with %v", path, st.Mode(), mode)
		}
	}
}

// The socket never exists at its path with a wider mode than asked, even
// under umask 000, which leaves a bound socket at 0777 until a chmod. An
// observer stats the path in a tight loop across many Listens.
func TestListenNeverExposesAWiderMode(t *testing.T) {
	dir := shortDir(t)
	// The umask is the process's: no test of this package runs in parallel.
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(dir, "q.sock")
	const mode = 0o600

	stop := make(chan struct{})
	type result struct{ seen, wider int }
	done := make(chan result)
	var sawIt atomic.Bool // the observer saw the socket since the last Listen
	go func() {
		var r result
		for {
			select {
			case <-stop:
				done <- r
				return
			default:
			}
			st, err := os.Lstat(path)
			if err != nil {
				continue
			}
			r.seen++
			sawIt.Store(true)
			if st.Mode().Perm()&^mode != 0 {
				r.wider++
			}
		}
	}()
	const rounds = 200
	for range rounds {
		sawIt.Store(false)
		l, err := Listen(path, mode)
		if err != nil {
			close(stop)
			<-done
			t.Fatalf("Listen: %v", err)
		}
		// Keep the socket until the observer has seen it, so every round
		// is observed at least once.
		waitFor(t, "the observer to see the socket", sawIt.Load)
		l.Close()
	}
	close(stop)
	r := <-done
	if r.wider != 0 {
		t.Fatalf("the socket was seen %d times of %d with a mode wider than %v", r.wider, r.seen, os.FileMode(mode))
	}
	if r.seen < rounds {
		t.Fatalf("the observer saw the socket %d times in %d rounds", r.seen, rounds)
	}
	// Nothing is left behind: no socket, no private directory.
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("directory after the rounds: %v, %v; want it empty", entries, err)
	}
}

// A umask that forbids everything narrows nothing Listen creates: the
// socket has exactly the mode asked, and the private directory it is bound
// in is usable and removed.
func TestListenModeUnderAStrictUmask(t *testing.T) {
	dir := shortDir(t)
	old := syscall.Umask(0o777)
	defer syscall.Umask(old)
	path := filepath.Join(dir, "q.sock")
	l := listen(t, path, 0o660)
	st, err := os.Stat(path)
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o660 {
		t.Fatalf("socket %s: %v, %v; want a socket with mode 0660", path, st, err)
	}
	if got := l.Addr().String(); got != path {
		t.Errorf("listener address %q, want %q", got, path)
	}
	accepted := make(chan error, 1)
	go func() {
		nc, err := l.Accept()
		if err == nil {
			nc.Close()
		}
		accepted <- err
	}()
	if !answers(path) {
		t.Fatal("the socket does not answer")
	}
	if err := <-accepted; err != nil {
		t.Fatalf("Accept: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 || entries[0].Name() != "q.sock" {
		t.Fatalf("directory holds %v, want only q.sock", entries)
	}
}

// A failed Listen leaves no private directory behind, and a socket whose
// path was bound by someone else after the stale check is not replaced.
func TestListenFailureLeavesNothing(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "q.sock")
	listen(t, path, 0o600)
	if _, err := Listen(path, 0o600); err == nil {
		t.Fatal("a second Listen on a live socket succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %v after a failed Listen, want only the first socket", entries)
	}
}

// The private directory must fit in sun_path too: the error says so
// before anything is created.
func TestListenDirectoryTooLongForThePrivateBind(t *testing.T) {
	base := shortDir(t)
	// A directory of 95 bytes and a short name: the path fits, the private
	// directory's socket (95 + 13 bytes) does not.
	dir := pathOfLen(t, base, 95)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := Listen(filepath.Join(dir, "q"), 0o600)
	if err == nil || !strings.Contains(err.Error(), "private directory") || !strings.Contains(err.Error(), "94") {
		t.Fatalf("Listen = %v, want an error naming the private directory and the 94-byte limit", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("directory holds %v, want nothing", entries)
	}
}
