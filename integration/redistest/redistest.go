package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

const (
	// readyTimeout bounds how long a start or restart may take, including AOF
	// loading; generous so a loaded CI machine does not flake.
	readyTimeout = 10 * time.Second
	// stopTimeout is how long a graceful stop may take before SIGKILL.
	stopTimeout = 10 * time.Second
	// startAttempts covers the race between releasing a probed free port and
	// redis-server binding it.
	startAttempts = 3
)

// Option changes how a Server is started.
type Option func(*config)

type config struct {
	args     []string
	tls      *Certs
	conf     string // a config file, the first argument (sentinels need one)
	sentinel bool
	cluster  bool
}

// WithArgs appends redis-server command-line arguments, for example
// WithArgs("--appendonly", "yes"). They are kept across Restart.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// Server is a redis-server process owned by one test.
type Server struct {
	bin     string
	dir     string
	logPath string
	extra   []string
	tls     *Certs
	conf    string
	sentin  bool
	tlsPort int // 0 unless started WithTLS; fixed once Start returns
	cluster bool
	busPort int // the cluster bus's port; 0 unless cluster

	mu     sync.Mutex
	port   int
	proc   *process
	client rueidis.Client // lazily created for Do
}

// process is one run of redis-server; done is closed once it has exited.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, valid after done is closed
}

// Start runs redis-server on a free port and returns once it answers PING.
// redis-server must be on PATH; a missing binary fails the test.
// The server is stopped when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := launch(t.TempDir(), t.TempDir(), opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		s.closeShared()
		if err := s.stop(); err != nil {
			t.Errorf("stop redis-server: %v", err)
		}
	})
	return s
}

// Launch is Start for programs that are not tests, such as the benchmark
// driver: the server keeps its data in dir and runs until Close.
func Launch(dir string, opts ...Option) (*Server, error) {
	return launch(dir, dir, opts)
}

// Close stops a server started by Launch.
func (s *Server) Close() error {
	s.closeShared()
	return s.stop()
}

// Pid is the process id of the running redis-server, 0 when stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

func launch(dataDir, logDir string, opts []Option) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH (%v); run `make test`, which installs it", err)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	s := &Server{
		bin:     bin,
		dir:     dataDir,
		logPath: filepath.Join(logDir, "redis.log"),
		extra:   cfg.args,
		tls:     cfg.tls,
		conf:    cfg.conf,
		sentin:  cfg.sentinel,
		cluster: cfg.cluster,
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		tlsPort := 0
		if s.tls != nil {
			if tlsPort, err = freePort(); err != nil {
				return nil, fmt.Errorf("pick a free port: %w", err)
			}
		}
		busPort := 0
		if s.cluster {
			// Not port+10000, Redis's default: that can exceed 65535.
			if busPort, err = freePort(); err != nil {
				return nil, fmt.Errorf("pick a free port: %w", err)
			}
		}
		s.mu.Lock()
		s.port = port
		s.mu.Unlock()
		s.tlsPort, s.busPort = tlsPort, busPort
		err = s.start()
		if err == nil {
			return s, nil
		}
		if attempt == startAttempts {
			return nil, fmt.Errorf("start redis-server: %w\n%s", err, s.log())
		}
	}
}

// Addr is "127.0.0.1:port".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrLocked()
}

func (s *Server) addrLocked() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL is "redis://127.0.0.1:port".
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Client returns a new rueidis client connected to the server, closed when
// the test ends. Across Restart it reconnects by itself, but a command in
// flight or the first one after the restart may fail with a connection
// error, as it would in production.
func (s *Server) Client(t testing.TB) rueidis.Client {
	t.Helper()
	c, err := newClient(s.Addr())
	if err != nil {
		t.Fatalf("connect to redis-server at %s: %v", s.Addr(), err)
	}
	t.Cleanup(c.Close)
	return c
}

// newClient connects to a standalone server. ForceSingleClient skips
// rueidis's cluster probe: when the server is down, the failed probe leaves a
// delayed refresh goroutine running that goleak reports.
func newClient(addr string) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{addr},
		DisableCache:      true,
		ForceSingleClient: true,
	})
}

// Do runs one command on a client shared by Do calls; the result, including a
// Redis error reply or a failure to connect, is the caller's to check. The
// shared client is replaced across Restart and Stop, so Do never sees the
// broken connection of the previous process.
func (s *Server) Do(t testing.TB, args ...string) rueidis.RedisResult {
	t.Helper()
	s.mu.Lock()
	if s.client == nil {
		c, err := newClient(s.addrLocked())
		if err != nil {
			s.mu.Unlock()
			return rueidis.NewErrorResult(fmt.Errorf("connect to redis-server: %w", err))
		}
		s.client = c
	}
	c := s.client
	s.mu.Unlock()
	// Not t.Context(): Do is also useful from Cleanup, where it is done.
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	return c.Do(ctx, c.B().Arbitrary(args...).Build())
}

// Restart shuts the server down with SHUTDOWN, so an append-only file is
// flushed, and starts it again on the same port, directory and arguments.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.closeShared()
	if err := s.shutdown(); err != nil {
		t.Fatalf("shut down redis-server: %v\n%s", err, s.log())
	}
	if err := s.start(); err != nil {
		t.Fatalf("restart redis-server: %v\n%s", err, s.log())
	}
}

// Stop stops the server and leaves it stopped; data not persisted is lost.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.closeShared()
	if err := s.stop(); err != nil {
		t.Fatalf("stop redis-server: %v", err)
	}
}

func (s *Server) closeShared() {
	s.mu.Lock()
	c := s.client
	s.client = nil
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	// An *os.File as stdout lets the child write directly: no copying
	// goroutine that could outlive the test.
	defer logf.Close()
	args := append([]string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "no",
	}, s.extra...)
	args = append(args, s.tlsArgs()...)
	args = append(args, s.clusterArgs()...)
	if s.conf != "" {
		args = append([]string{s.conf}, args...)
	}
	if s.sentin {
		args = append(args, "--sentinel")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.SysProcAttr = procAttr()
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	if err := waitReady(s.addrLocked(), p); err != nil {
		_ = p.kill()
		s.proc = nil
		return err
	}
	return nil
}

// waitReady polls with a growing backoff until the process answers, exits,
// or readyTimeout passes.
func waitReady(addr string, p *process) error {
	deadline := time.Now().Add(readyTimeout)
	backoff := 5 * time.Millisecond
	var last error
	for time.Now().Before(deadline) {
		if last = probe(addr, p.cmd.Process.Pid); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("redis-server exited before answering PING: %v", p.err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
	return fmt.Errorf("no PONG from %s within %v: %w", addr, readyTimeout, last)
}

// probe sends PING and INFO server. PING answers -LOADING until an
// append-only file is replayed; INFO's process_id proves the answer comes
// from our process and not from another server that won the race for the
// port while ours failed to bind.
func probe(addr string, pid int) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("ping reply %q", strings.TrimSpace(line))
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
	if err != nil || !strings.HasPrefix(line, "$") {
		return fmt.Errorf("info reply %q", strings.TrimSpace(line))
	}
	info := make([]byte, n)
	if _, err := io.ReadFull(r, info); err != nil {
		return err
	}
	if !strings.Contains(string(info), "\r\nprocess_id:"+strconv.Itoa(pid)+"\r\n") {
		return fmt.Errorf("another process answers on %s", addr)
	}
	return nil
}

// shutdown sends SHUTDOWN and waits for the process to exit. The connection
// closing without a reply is the success case.
func (s *Server) shutdown() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return errors.New("not running")
	}
	conn, err := net.DialTimeout("tcp", s.addrLocked(), time.Second)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	_ = conn.SetDeadline(time.Now().Add(stopTimeout))
	_, err = conn.Write([]byte("*1\r\n$8\r\nSHUTDOWN\r\n"))
	if err == nil {
		// A reply means SHUTDOWN was refused (e.g. the AOF could not be
		// written); EOF means the server went away as asked.
		line, rerr := bufio.NewReader(conn).ReadString('\n')
		if rerr == nil {
			err = fmt.Errorf("shutdown reply %q", strings.TrimSpace(line))
		}
	}
	conn.Close()
	if err != nil {
		return err
	}
	select {
	case <-p.done:
		s.proc = nil
		return nil
	case <-time.After(stopTimeout):
		_ = p.kill()
		s.proc = nil
		return fmt.Errorf("still running %v after SHUTDOWN; killed", stopTimeout)
	}
}

// stop sends SIGTERM (which redis-server handles like SHUTDOWN), waits, and
// falls back to SIGKILL. Stopping a stopped server is a no-op.
func (s *Server) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		select {
		case <-p.done: // already exited
			return nil
		default:
			return fmt.Errorf("sigterm: %w", err)
		}
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		if err := p.kill(); err != nil {
			return fmt.Errorf("still running %v after SIGTERM; kill: %w", stopTimeout, err)
		}
		return fmt.Errorf("still running %v after SIGTERM; killed", stopTimeout)
	}
}

func (p *process) kill() error {
	err := p.cmd.Process.Kill()
	<-p.done
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

func (s *Server) log() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no redis-server log: %v)", err)
	}
	return "redis-server log:\n" + string(b)
}

// freePort asks the kernel for an unused port on 127.0.0.1. The port is free
// when returned, not reserved; Start retries if redis-server loses the race.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ScriptCalls is how many EVAL and EVALSHA calls (the _RO variants too)
// the server has run since it started or since ResetStats.
func (s *Server) ScriptCalls(t testing.TB) int64 {
	t.Helper()
	info, err := s.Do(t, "INFO", "commandstats").ToString()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		if !strings.HasPrefix(line, "cmdstat_eval") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		calls, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		n += v
	}
	return n
}

// ResetStats resets the server's command statistics (CONFIG RESETSTAT).
func (s *Server) ResetStats(t testing.TB) {
	t.Helper()
	if err := s.Do(t, "CONFIG", "RESETSTAT").Error(); err != nil {
		t.Fatalf("CONFIG RESETSTAT: %v", err)
	}
}

// StartAt runs a fresh redis-server at addr, where a stopped server
// listened: a Server cannot be started again after Stop, and a test of a
// client that must find Redis back at the address it was given needs one
// there. The new server starts empty, like a Redis restarted without
// persistence, and is killed when the test ends.
func StartAt(t testing.TB, addr string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", "--port", port, "--bind", host, "--dir", t.TempDir(),
		"--save", "", "--appendonly", "no", "--protected-mode", "no")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("redis-server at %s exited (the port may have been taken)", addr)
		default:
		}
		if pong(addr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server at %s did not answer PING", addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pong reports whether a Redis at addr answers PING.
func pong(addr string) bool {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(time.Second))
	if _, err := nc.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, _ := bufio.NewReader(nc).ReadString('\n')
	return line == "+PONG\r\n"
}
