package sidecar

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"quotad/dispatch"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

// Defaults of the server's limits; the CLI exposes each as a flag.
const (
	DefaultMaxLineBytes       = 16 << 10
	DefaultMaxConns           = 10_000
	DefaultMaxInflightPerConn = 128
	// DefaultFlushDelay is the --redis-flush-delay default. Without it
	// rueidis wrote to Redis each time its writer caught up with the
	// callers, which was 31% of the CPU of BenchmarkSocketPipelined;
	// 20us cut that benchmark's CPU per take by 30% and did not change
	// BenchmarkSocketOneAtATime's (see docs/performance.md).
	DefaultFlushDelay = 20 * time.Microsecond
	// DefaultProcs is the --procs default: quotad's Go code runs on one
	// thread at a time. Its work is short and waits on sockets; with more
	// processors the runtime woke idle threads to look for work at every
	// request and kept its monitor thread waking every 20 µs, which on a
	// 2-core machine cost more CPU than the requests and took it from Redis
	// and the clients (see docs/performance.md).
	DefaultProcs = 1
	// DefaultIdleTimeout is the --idle-timeout default: off. A pooled
	// client's idle connection looks like a forgotten one, and closing it
	// would make that client's next request race the close. The per-peer
	// cap is what keeps one process from holding every connection.
	DefaultIdleTimeout = time.Duration(0)
)

// DefaultMaxConnsPerPeer is the --max-conns-per-peer default for a given
// --max-conns: half of it, so that one process never holds every connection
// and the others always have room; but at least minDefaultConnsPerPeer (or
// all of a smaller --max-conns), so that a client's pool is not limited
// even where --max-conns is small.
func DefaultMaxConnsPerPeer(maxConns int) int {
	return max(maxConns/2, min(maxConns, minDefaultConnsPerPeer))
}

// minDefaultConnsPerPeer is far above the connections a client pool keeps
// to a local sidecar (a few per thread or event loop).
const minDefaultConnsPerPeer = 64

// Options configures a Server. Zero values take the defaults above.
type Options struct {
	Store     *store.Store
	Config    *policy.Config
	KeyPrefix string
	// RedisTimeout is the deadline of every Redis call; a request's
	// timeout_ms may shorten it, never lengthen it.
	RedisTimeout       time.Duration
	MaxLineBytes       int
	MaxConns           int
	MaxInflightPerConn int
	AllowInline        bool
	Version            string
	Logger             *zap.Logger
	// LogDecisions is none (or empty), denied or all: which takes get a
	// line in the sampled decision log.
	LogDecisions string
	// IdleTimeout closes a connection that has no request in flight and
	// has sent nothing for that long; 0 never does.
	IdleTimeout time.Duration
	// MaxConnsPerPeer caps the connections of one client process, told
	// apart by the pid that SO_PEERCRED reports. 0 takes
	// DefaultMaxConnsPerPeer(MaxConns). A peer whose pid is 0 (it is in a
	// pid namespace this process cannot see) is under MaxConns only.
	MaxConnsPerPeer int
	// Tracer makes a span of every decision and its Redis calls; nil for
	// none (package tracing builds it from the OTEL_* environment).
	Tracer trace.TracerProvider
}

// Server answers protocol requests on Unix-socket connections.
//
// Its shape follows net/http: Serve blocks until the listener fails or the
// server is shut down, Shutdown drains, Close forces.
type Server struct {
	opts     Options
	log      *zap.Logger
	store    *store.Store
	dispatch *dispatch.Dispatcher

	// reqCtx is the parent of every request's context. It is cancelled when
	// draining runs out of time, so in-flight Redis calls end at once.
	reqCtx    context.Context
	cancelReq context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]int32 // open connections, to their peer's pid (0: unknown)
	peers     map[int32]int   // open connections of each known pid
	shutting  atomic.Bool
	idle      chan struct{} // closed when shutting and no connection is left
	idleOnce  sync.Once

	metrics     *metrics
	connMetrics *connMetrics
	readiness   readiness
	// fronts are the other ways in to the dispatcher (AddFront).
	fronts []Front
}

// A Front is another way in to the server's dispatcher than its socket
// (Envoy's rate limit service, rls/): it drains and closes with the
// server, and the dispatcher closes only after it stopped.
type Front interface {
	// Shutdown stops taking calls and lets those in flight finish until
	// ctx ends.
	Shutdown(ctx context.Context) error
	// Stop ends every call at once.
	Stop()
}

// AddFront has f drain and close with the server. Call it before Run.
func (s *Server) AddFront(f Front) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fronts = append(s.fronts, f)
}

// Dispatcher is the server's dispatcher, for another front (AddFront) to
// decide through.
func (s *Server) Dispatcher() *dispatch.Dispatcher { return s.dispatch }

// Registry is the registry of the server's metrics (/metrics), for another
// front's.
func (s *Server) Registry() *prometheus.Registry { return s.metrics.reg }

// TraceContextInvalid counts a request of another front whose trace
// context was ignored, in quotad_trace_context_invalid_total.
func (s *Server) TraceContextInvalid() { s.metrics.traceInvalid.Inc() }

// NewServer returns a server ready to Serve.
func NewServer(opts Options) *Server {
	if opts.MaxLineBytes <= 0 {
		opts.MaxLineBytes = DefaultMaxLineBytes
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.MaxConnsPerPeer <= 0 {
		opts.MaxConnsPerPeer = DefaultMaxConnsPerPeer(opts.MaxConns)
	}
	if opts.IdleTimeout < 0 {
		opts.IdleTimeout = 0
	}
	if opts.MaxInflightPerConn <= 0 {
		opts.MaxInflightPerConn = DefaultMaxInflightPerConn
	}
	if opts.RedisTimeout <= 0 {
		opts.RedisTimeout = store.DefaultRedisTimeout
	}
	if opts.Config == nil {
		opts.Config = &policy.Config{Policies: map[string]*policy.Policy{}}
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		opts:      opts,
		log:       opts.Logger.Named("server"),
		store:     opts.Store,
		reqCtx:    ctx,
		cancelReq: cancel,
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]int32),
		peers:     make(map[int32]int),
		idle:      make(chan struct{}),
	}
	s.metrics = newMetrics(s)
	s.dispatch = dispatch.New(dispatch.Options{
		Store: opts.Store, Config: opts.Config, KeyPrefix: opts.KeyPrefix,
		RedisTimeout: opts.RedisTimeout, AllowInline: opts.AllowInline,
		Logger: opts.Logger, LogDecisions: opts.LogDecisions, Registry: s.metrics.reg,
		Context: ctx, Draining: s.shutting.Load, Tracer: opts.Tracer,
	})
	s.connMetrics = newConnMetrics(s.metrics.reg)
	return s
}

// SetConfig swaps the policies in use. Requests already running keep the
// config they started with; the next request sees the new one.
func (s *Server) SetConfig(c *policy.Config) { s.dispatch.SetConfig(c) }

// Config returns the policies in use.
func (s *Server) Config() *policy.Config { return s.dispatch.Config() }

// Reloaded counts a policy file reload (policy.Target).
func (s *Server) Reloaded(err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	s.metrics.reloads.WithLabelValues(result).Inc()
}

// Healed is the number of quota keys found without a TTL and repaired.
func (s *Server) Healed() int64 { return s.dispatch.Healed() }

// Conns is the number of open connections.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Serve accepts connections on l until Shutdown or Close, then returns
// ErrServerClosed. Cancelling ctx closes the server.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, s.Close)
	defer stop()

	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.shutting.Load() {
				return ErrServerClosed
			}
			if isTemporaryAccept(err) {
				// Out of file descriptors and the like: wait instead of spinning.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; retrying", zap.Error(err), zap.Duration(keyBackoff, backoff))
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		backoff = 0
		c := newConn(s, nc)
		pid := peerPID(nc)
		switch s.track(c, pid) {
		case tracked:
			go c.serve()
		case shuttingDown:
			s.refuse(nc, protocol.CodeShuttingDown, "the sidecar is shutting down: nothing was run")
		case overMaxConns:
			s.connMetrics.refused.WithLabelValues(refusedMaxConns).Inc()
			s.refuse(nc, protocol.CodeUnavailable, fmt.Sprintf("connection limit reached (%d): nothing was run; retry later", s.opts.MaxConns))
		case overMaxConnsPerPeer:
			s.connMetrics.refused.WithLabelValues(refusedMaxConnsPerPeer).Inc()
			s.refuse(nc, protocol.CodeUnavailable, fmt.Sprintf("connection limit per process reached (%d connections of pid %d): nothing was run; close idle connections or retry later", s.opts.MaxConnsPerPeer, pid))
		}
	}
}

func isTemporaryAccept(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.ECONNABORTED)
}

// refuse answers a connection it will not serve with one error line.
func (s *Server) refuse(nc net.Conn, code protocol.Code, msg string) {
	_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = nc.Write(protocol.AppendError(nil, nil, code, msg))
	_ = nc.Close()
}

// trackResult says whether a new connection is served, and if not, why.
type trackResult uint8

const (
	tracked trackResult = iota
	shuttingDown
	overMaxConns
	overMaxConnsPerPeer
)

// track adds a connection from the peer with pid (0: unknown), unless the
// server is shutting down or a limit is reached.
func (s *Server) track(c *conn, pid int32) trackResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() {
		return shuttingDown
	}
	if len(s.conns) >= s.opts.MaxConns {
		return overMaxConns
	}
	if pid != 0 {
		if s.peers[pid] >= s.opts.MaxConnsPerPeer {
			return overMaxConnsPerPeer
		}
		s.peers[pid]++
	}
	s.conns[c] = pid
	return tracked
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pid, ok := s.conns[c]; ok && pid != 0 {
		if s.peers[pid]--; s.peers[pid] <= 0 {
			delete(s.peers, pid)
		}
	}
	delete(s.conns, c)
	if s.shutting.Load() && len(s.conns) == 0 {
		s.idleOnce.Do(func() { close(s.idle) })
	}
}

// Shutdown stops accepting, answers lines read from now on with
// SHUTTING_DOWN, and waits for in-flight requests to be answered. Idle
// connections stop reading at once; a connection with requests in flight
// reads on until they are answered, so lines its client sends meanwhile get
// SHUTTING_DOWN rather than a closed connection. When ctx ends first,
// in-flight Redis calls are cancelled (their callers get SHUTTING_DOWN: the
// outcome is unknown), reading stops, replies get a moment to be written,
// and the remaining connections are closed; ctx's error is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop((*conn).drain)
	fronts := s.drainFronts(ctx)

	select {
	case <-s.idle:
		<-fronts
		// Every request is answered: give back the units of allotments
		// still held, before the calls' context ends.
		s.dispatch.ReturnAllotments(ctx)
		s.cancelReq()
		s.dispatch.Close()
		return nil
	case <-ctx.Done():
	}
	s.cancelReq()
	grace := time.Now().Add(500 * time.Millisecond)
	s.mu.Lock()
	for c := range s.conns {
		c.stopReading()
		_ = c.nc.SetWriteDeadline(grace)
	}
	s.mu.Unlock()
	select {
	case <-s.idle:
	case <-time.After(time.Until(grace) + 100*time.Millisecond):
	}
	s.Close()
	<-fronts
	return ctx.Err()
}

// drainFronts shuts the fronts down until ctx ends; the channel closes
// when every one has returned.
func (s *Server) drainFronts(ctx context.Context) <-chan struct{} {
	s.mu.Lock()
	fronts := slices.Clone(s.fronts)
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for _, f := range fronts {
			wg.Go(func() {
				if err := f.Shutdown(ctx); err != nil {
					s.log.Warn("a front did not drain in time", zap.Error(err))
				}
			})
		}
		wg.Wait()
	}()
	return done
}

// Close closes the listeners and every connection at once and cancels
// in-flight Redis calls.
func (s *Server) Close() {
	s.stop((*conn).close)
	s.mu.Lock()
	fronts := slices.Clone(s.fronts)
	s.mu.Unlock()
	for _, f := range fronts {
		f.Stop()
	}
	s.cancelReq()
	s.dispatch.Close()
}

// stop marks the server as shutting down, closes the listeners and applies
// each to every open connection.
func (s *Server) stop(each func(*conn)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutting.Store(true)
	for l := range s.listeners {
		l.Close()
	}
	clear(s.listeners)
	for c := range s.conns {
		each(c)
	}
	if len(s.conns) == 0 {
		s.idleOnce.Do(func() { close(s.idle) })
	}
}

// Listen creates the Unix socket at path with the given mode. A leftover
// socket file that nobody answers on is replaced; a live socket or a path
// that is not a socket is an error, so two sidecars never steal each other's
// socket and a mistyped path never deletes a file.
//
// The socket never exists at path with a wider mode than asked, whatever
// the umask: it is bound in a private directory (mode 0700) created next to
// path, given its mode there, and then linked into place. link(2), unlike
// rename(2), fails when path exists, so a socket that appeared at path since
// the check above is left alone. The process umask is never changed: it is
// process-wide, and narrowing it for the bind would narrow files that other
// goroutines create meanwhile.
func Listen(path string, mode os.FileMode) (net.Listener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("--socket %q: path is %d bytes, a unix socket path allows at most %d", path, len(path), maxSocketPath)
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("--socket %q: directory %s: %w", path, dir, err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("--socket %q: %s is not a directory", path, dir)
	}
	// The private directory is dir/.qXXXXXXXX, the socket in it "s".
	if n := len(dir) + len("/.q01234567/s"); n > maxSocketPath {
		return nil, fmt.Errorf("--socket %q: directory %s is %d bytes, at most %d: the socket is first bound in a private directory inside it",
			path, dir, len(dir), maxSocketPath-len("/.q01234567/s"))
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--socket %q: path exists and is not a socket", path)
		}
		// Only a refused connection proves nobody listens; a full backlog
		// or a permission error may hide a live sidecar.
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("--socket %q: another process is serving on it", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("--socket %q: cannot tell whether the existing socket is in use: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	private, err := makePrivateDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--socket %q: create a private directory to bind in: %w", path, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on unix socket: %w", err)
	}
	// The socket's name moves to path; the wrapper removes that name.
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	if err := os.Link(tmp, path); err != nil {
		l.Close()
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("--socket %q: another process created it while this one started", path)
		}
		return nil, fmt.Errorf("--socket %q: move the socket into place: %w", path, err)
	}
	return &unixListener{UnixListener: l, addr: &net.UnixAddr{Name: path, Net: "unix"}}, nil
}

// maxSocketPath is the longest path a Unix socket can be bound at: sun_path
// holds 108 bytes on Linux, including the terminating NUL.
const maxSocketPath = 107

// makePrivateDir creates a directory in dir that only this user may enter.
// The umask may only narrow Mkdir's 0700; Chmod makes it exactly 0700 so
// the socket can be bound in it (and it never is wider).
func makePrivateDir(dir string) (string, error) {
	for range 100 {
		p := filepath.Join(dir, fmt.Sprintf(".q%08x", rand.Uint32()))
		err := os.Mkdir(p, 0o700)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		if err := os.Chmod(p, 0o700); err != nil {
			os.Remove(p)
			return "", err
		}
		return p, nil
	}
	return "", errors.New("no free name")
}

// unixListener is a listener whose socket was bound under another name and
// linked to addr: Addr reports addr, and Close removes it, as
// net.UnixListener does for the name it bound.
type unixListener struct {
	*net.UnixListener
	addr *net.UnixAddr
	once sync.Once
}

func (l *unixListener) Addr() net.Addr { return l.addr }

// Close removes the socket's name, then closes the socket, in
// net.UnixListener's order. Only the first call removes the name: after it,
// the name may be another sidecar's.
func (l *unixListener) Close() error {
	l.once.Do(func() { _ = os.Remove(l.addr.Name) })
	return l.UnixListener.Close()
}
