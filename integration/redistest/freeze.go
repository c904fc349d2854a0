package redistest

import (
	"errors"
	"syscall"
	"testing"
)

// Freeze stops the redis-server process with SIGSTOP: connections stay open
// and accept bytes, but nothing is answered, as with a hung host or a
// network that drops packets. Thaw resumes it; a frozen server is thawed
// when the test ends, before it is stopped. Do not call Do while frozen: it
// waits for the reply.
func (s *Server) Freeze(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { _ = s.send(syscall.SIGCONT) })
}

// Thaw resumes a server stopped by Freeze.
func (s *Server) Thaw(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGCONT)
}

func (s *Server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := s.send(sig); err != nil {
		t.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}

func (s *Server) send(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("not running")
	}
	return s.proc.cmd.Process.Signal(sig)
}
