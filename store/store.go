package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"quotad/rawio"
)

// Store kinds reported by ping.
const (
	StoreRedis    = "redis"
	StoreEmbedded = "embedded"
)

// Store is the Redis the sidecar decides against: one rueidis client for the
// whole process (auto-pipelining multiplexes every socket client over a few
// connections), or an in-process store for trying quotad on a bare machine.
//
// When Redis cannot be reached at start the store keeps connecting in the
// background; until then every call fails fast with ErrNotConnected.
//
// The health state is the circuit breaker: once a call or a probe finds
// Redis unreachable or too slow, the breaker is open and Client fails fast
// with ErrBreakerOpen, so callers are answered at once instead of each
// waiting out the timeout. Only the background probe closes it (see damper).
//
// On a Redis Cluster each node that owns slots has a breaker of its own
// (cluster.go): Admit refuses a request only when the node serving its key
// is down, so a dead master stops its own slots and no others.
type Store struct {
	kind string
	log  *zap.Logger
	// topologyLevel is the level of the lines that say Redis, or a Cluster
	// node, is up and which nodes own the slots: info, but debug for the
	// embedded store, one node in this process that answers as a Cluster
	// and has no topology worth an operator's attention.
	topologyLevel zapcore.Level
	client        atomic.Pointer[rueidis.Client]
	// breaker is the health of a single server or a Sentinel's master, and
	// of the connection attempts before a Cluster is known.
	breaker
	// cluster is set, before client, when the client is a Cluster's.
	cluster atomic.Pointer[clusterHealth]
	embed   *miniredis.Miniredis
	// started is closed once the first connection attempt has an outcome
	// (Started).
	started   chan struct{}
	startOnce sync.Once

	timeout time.Duration
	stop    context.CancelFunc
	wg      sync.WaitGroup

	// onConnect is told of the nodes in dialed (OnConnect).
	onConnect atomic.Pointer[func(addr string, node rueidis.Client)]
	// dialed are the nodes connected to again (or all nodes, "") that
	// onConnect has not been told of; connected wakes the goroutine that
	// tells it. lost are the nodes a connection to was closed since the
	// last dial to them.
	dialedMu  sync.Mutex
	dialed    map[string]bool
	lost      map[string]bool
	seen      map[string]bool // the nodes ever connected to
	connected chan struct{}
}

// Redis health as the store last saw it. Unknown is a state of its own so
// that the first failure at start is logged as "redis is down" too.
const (
	healthUnknown int32 = iota
	healthUp
	healthDown
)

// DefaultRedisTimeout bounds every Redis call and probe unless configured.
const DefaultRedisTimeout = time.Second

// Log keys of the store's lines.
const (
	keyCloseProbes = "close_probes"
	keyBackoff     = "backoff"
)

// ErrNotConnected is returned while the store has no Redis connection yet.
var ErrNotConnected = errors.New("not connected to redis")

// StoreOptions configures OpenStore.
type StoreOptions struct {
	// RedisURL in rueidis syntax (redis://, rediss://, unix://, addr=,
	// master_set=). Empty means the embedded store.
	RedisURL string
	// Timeout bounds every probe; calls get their own deadlines. Zero means
	// DefaultRedisTimeout.
	Timeout time.Duration
	// ProbeInterval is how often Redis is pinged to report health. Zero means
	// once a second.
	ProbeInterval time.Duration
	// Logger may be nil for no logs.
	Logger *zap.Logger
	// CAFile is a PEM file of the CAs that sign Redis's TLS certificate
	// (rediss:// only); empty means the system's.
	CAFile string
	// Password and PasswordFile are other sources of the Redis password than
	// the URL; at most one source may be used. The file is read once, here,
	// and a trailing newline is dropped.
	Password     string
	PasswordFile string
	// FlushDelay is rueidis's MaxFlushDelay: how long a connection's writer
	// waits after a write for more commands to send in the next one. Zero
	// writes at once.
	FlushDelay time.Duration
}

// OpenStore parses the URL and starts connecting. A malformed URL is an
// error now; an unreachable Redis is not (the sidecar serves UNAVAILABLE and
// recovers by itself when Redis comes up).
func OpenStore(opts StoreOptions) (*Store, error) {
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = time.Second
	}
	if opts.Timeout <= 0 {
		// A zero probe deadline would expire at once and report Redis down.
		opts.Timeout = DefaultRedisTimeout
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{log: opts.Logger.Named("store"), timeout: opts.Timeout, stop: cancel, started: make(chan struct{}),
		dialed: map[string]bool{}, lost: map[string]bool{}, seen: map[string]bool{}, connected: make(chan struct{}, 1)}
	s.damper.every = opts.ProbeInterval
	var copt rueidis.ClientOption
	if opts.RedisURL == "" {
		s.kind = StoreEmbedded
		s.topologyLevel = zapcore.DebugLevel
		s.embed = miniredis.NewMiniRedis()
		s.embed.ClockTTL(true) // TTLs follow the wall clock, like a real Redis
		if err := s.embed.StartAddr("127.0.0.1:0"); err != nil {
			cancel()
			return nil, fmt.Errorf("start embedded store: %w", err)
		}
		// The embedded store has no client-side caching support.
		copt = rueidis.ClientOption{InitAddress: []string{s.embed.Addr()}, DisableCache: true}
	} else {
		s.kind = StoreRedis
		var err error
		copt, err = redisClientOption(opts)
		if err != nil {
			cancel()
			return nil, err
		}
		// Decisions are scripts, never cached reads.
		copt.DisableCache = true
	}
	// Queue every command, even on an idle connection. Otherwise rueidis
	// runs a lone call with a deadline synchronously, where only the
	// deadline ends it: Shutdown's cancellation would not reach it, and a
	// timed-out call would close the connection.
	copt.AlwaysPipelining = true
	// rueidis closes a connection whose replies are this late; keep that
	// above the call deadline so --redis-timeout decides, not rueidis.
	copt.ConnWriteTimeout = max(10*time.Second, 2*opts.Timeout)
	copt.MaxFlushDelay = opts.FlushDelay
	copt.DialCtxFn = s.dialer(rawio.Dialer(copt.DialCtxFn))
	copt.RetryDelay = s.retryDelay
	// On a Cluster, rueidis also re-reads its slot map periodically: it
	// otherwise refreshes only after a failed call or connection, and a
	// master that hangs instead of dying fails neither until its
	// connection times out, so after the promotion calls would still go
	// to it for ConnWriteTimeout.
	copt.ClusterOption.ShardsRefreshInterval = routingRefresh(opts.ProbeInterval)
	s.wg.Add(1)
	go s.run(ctx, copt, opts.ProbeInterval)
	return s, nil
}

// Kind is StoreRedis or StoreEmbedded.
func (s *Store) Kind() string { return s.kind }

// Up reports whether Redis answered the last call or probe. It is false
// while the breaker is open. On a Cluster it is true when every node that
// owns slots is up (the cluster serves every slot).
func (s *Store) Up() bool {
	if ch := s.cluster.Load(); ch != nil {
		return ch.allUp()
	}
	return s.health.Load() == healthUp
}

// ProbeInterval is how often the background probe pings Redis.
func (s *Store) ProbeInterval() time.Duration { return s.damper.every }

// Client returns the rueidis client; ErrNotConnected before the first
// connection. On a single server or Sentinel it returns ErrBreakerOpen
// while Redis is down; on a Cluster only while no node that owns slots is
// known to be up (Admit tells about one key's node).
func (s *Store) Client() (rueidis.Client, error) {
	c := s.client.Load()
	if c == nil {
		if err := s.LastError(); err != nil {
			// %v, not %w: the cause must not look like this call's own
			// timeout, which would make its outcome unknown; it was not run.
			return nil, fmt.Errorf("%w: %v", ErrNotConnected, err)
		}
		return nil, ErrNotConnected
	}
	if ch := s.cluster.Load(); ch != nil {
		if !ch.anyUp() {
			return nil, ErrBreakerOpen
		}
		return *c, nil
	}
	if s.health.Load() == healthDown {
		return nil, ErrBreakerOpen
	}
	return *c, nil
}

// Admit reports whether a call on key may be sent: nil when the Redis that
// serves key is not known to be down. On a Cluster that is the node owning
// key's slot, and the error (wrapping ErrBreakerOpen) names it; elsewhere it
// is the one breaker. It costs a hash of the key and two atomic reads.
func (s *Store) Admit(key string) error {
	if ch := s.cluster.Load(); ch != nil {
		return ch.admit(key)
	}
	if s.health.Load() == healthDown {
		return ErrBreakerOpen
	}
	return nil
}

// Health is what the result of a call tells of the Redis that served it,
// as its caller judged it.
type Health int8

const (
	// HealthNone: nothing; the call was not sent, its caller gave up, or
	// it had too little time at Redis for its running out to count.
	HealthNone Health = iota
	// HealthUp: Redis answered, even with an error reply.
	HealthUp
	// HealthDown: Redis did not answer a call that had time to.
	HealthDown
)

// Observe records what a call on key sent at sent (zero when unknown)
// found, h, with its error (nil for none): an answer from Redis means the Redis serving key is up, and a
// failure that it is not. On a Cluster an error reply that says the slot
// map moved has the map read again, and a failure to reach another node
// than key's slot owner (the client's slot map was older) counts against
// that node.
func (s *Store) Observe(key string, sent time.Time, h Health, err error) {
	if h == HealthNone {
		return
	}
	if ch := s.cluster.Load(); ch != nil {
		ch.observe(key, sent, h == HealthUp, err)
		return
	}
	changed, need := s.set(h == HealthUp, false, sent, err)
	s.logChange(changed, h == HealthUp, need, err)
}

// setUp moves the one breaker's health to up or down (see breaker.set) and
// logs a change.
func (s *Store) setUp(up, probe bool, err error) {
	changed, need := s.set(up, probe, time.Time{}, err)
	s.logChange(changed, up, need, err)
}

func (s *Store) logChange(changed, up bool, need int, err error) {
	if !changed {
		return
	}
	if up {
		s.log.Log(s.topologyLevel, "redis is up")
	} else {
		s.log.Warn("redis is down", zap.Error(err), zap.Int(keyCloseProbes, need))
	}
}

// run connects (retrying with backoff) and then probes Redis periodically so
// that ping and the logs reflect its health even when no request comes in.
func (s *Store) run(ctx context.Context, copt rueidis.ClientOption, every time.Duration) {
	defer s.wg.Done()
	backoff := 100 * time.Millisecond
	var c rueidis.Client
	for {
		var err error
		if c, err = rueidis.NewClient(copt); err == nil {
			break
		}
		err = describeRedisErr(err)
		s.setUp(false, false, err)
		s.markStarted()
		s.log.Warn("cannot connect to redis, retrying", zap.Error(err), zap.Duration(keyBackoff, backoff))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	s.wg.Add(1)
	go s.tell(ctx)
	if c.Mode() == rueidis.ClientModeCluster {
		ch := newClusterHealth(s.log, every, s.timeout, routingRefresh(every))
		ch.topologyLevel = s.topologyLevel
		ch.mapChanged = func() { s.dial("") }
		ch.newNode = s.dial
		// The first slot map and node health before the client is
		// published, so that Admit never runs without them.
		ch.probe(ctx, c)
		ch.pings.Wait()
		s.cluster.Store(ch)
		s.client.Store(&c)
		s.dial("")
		s.setUp(true, true, nil)
		s.markStarted()
		ch.run(ctx, c)
		return
	}
	s.client.Store(&c)
	s.dial("")
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.probe(ctx, c)
		s.markStarted()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// OnConnect has fn told, on a goroutine of the store's, of every node of
// Redis the client connects to, with the client that sends to that node
// alone (rueidis.Client.Nodes): every node the client knows once it is
// connected (at once when it already is), a node the client first
// connects to later (a Sentinel's new master), a node again whenever a
// connection to it replaces one that was closed (Redis restarted, or the
// link broke), a Cluster's node when the client first knows it (a replica
// that joined or finished its sync), and every node again when a
// Cluster's slot map changes (a replica was promoted). Package luascript's Loader puts the scripts there before
// decisions need them. A later call replaces fn; nil stops the telling.
func (s *Store) OnConnect(fn func(addr string, node rueidis.Client)) {
	if fn == nil {
		s.onConnect.Store(nil)
		return
	}
	// fn and the mark of every node are set together, so tell cannot
	// tell fn of a node and then of every node again for the same
	// connection.
	s.dialedMu.Lock()
	s.onConnect.Store(&fn)
	s.dialed[""] = true
	s.dialedMu.Unlock()
	s.wake()
}

// dialer wraps the client's dial function: the first connection to a node
// (a Sentinel's new master) and one that replaces a connection that was
// closed (Redis restarted, or the link broke) have onConnect told of the
// node; one that adds to those open (rueidis opens its connections as
// calls need them) does not. rueidis dials while it
// holds its own locks, so the telling happens later, on tell's goroutine.
func (s *Store) dialer(dial func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error)) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	return func(ctx context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		nc, err := dial(ctx, dst, d, cfg)
		if err != nil {
			return nil, err
		}
		s.dialedMu.Lock()
		tell := s.lost[dst] || !s.seen[dst]
		delete(s.lost, dst)
		s.seen[dst] = true
		s.dialedMu.Unlock()
		if tell {
			s.dial(dst)
		}
		return &watchedConn{Conn: nc, s: s, addr: dst}, nil
	}
}

// watchedConn is a connection to a Redis node whose Close is noted: the
// next connection to the node replaces it.
type watchedConn struct {
	net.Conn
	s    *Store
	addr string
	once sync.Once
}

func (c *watchedConn) Close() error {
	c.once.Do(func() {
		c.s.dialedMu.Lock()
		c.s.lost[c.addr] = true
		c.s.dialedMu.Unlock()
	})
	return c.Conn.Close()
}

// dial marks addr ("" for every node) as newly connected.
func (s *Store) dial(addr string) {
	s.dialedMu.Lock()
	s.dialed[addr] = true
	s.dialedMu.Unlock()
	s.wake()
}

// wake has tell look at the marked nodes.
func (s *Store) wake() {
	select {
	case s.connected <- struct{}{}:
	default:
	}
}

// tell tells onConnect of the nodes dial marked, once the client is
// published and onConnect set, until ctx ends.
func (s *Store) tell(ctx context.Context) {
	defer s.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.connected:
		}
		c := s.client.Load()
		if c == nil {
			continue // the client's publication wakes tell again
		}
		s.dialedMu.Lock()
		fn := s.onConnect.Load()
		if fn == nil {
			s.dialedMu.Unlock()
			continue // OnConnect wakes tell again
		}
		dialed := s.dialed
		s.dialed = map[string]bool{}
		s.dialedMu.Unlock()
		nodes := (*c).Nodes()
		for addr, node := range nodes {
			if dialed[""] || dialed[addr] {
				(*fn)(addr, node)
			}
		}
	}
}

// Started is closed once the store's first connection attempt has an
// outcome: connected and probed, or failed. A sidecar that waits for it
// before it listens answers its first requests knowing whether Redis is
// there, instead of "not connected" while the first dial is under way.
func (s *Store) Started() <-chan struct{} { return s.started }

func (s *Store) markStarted() { s.startOnce.Do(func() { close(s.started) }) }

func (s *Store) probe(ctx context.Context, c rueidis.Client) {
	pctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := c.Do(pctx, c.B().Ping().Build()).Error()
	if ctx.Err() != nil {
		return
	}
	s.probed(err)
}

// probed feeds a probe's outcome to the one breaker (see breaker.probed).
func (s *Store) probed(err error) {
	changed, need := s.breaker.probed(err)
	s.logChange(changed, err == nil || isRedisReply(err), need, err)
}

// Close stops probing and closes the client and the embedded store.
func (s *Store) Close() {
	s.stop()
	s.wg.Wait()
	if c := s.client.Load(); c != nil {
		(*c).Close()
	}
	if s.embed != nil {
		s.embed.Close()
	}
}

// isRedisReply reports whether err is an error reply from Redis itself, as
// opposed to a transport failure.
func isRedisReply(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re)
}

// RedactURL hides the password of a Redis URL for logs and errors.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		// Not parseable: show only the scheme so nothing secret leaks.
		if i := strings.Index(raw, "://"); i > 0 {
			return raw[:i] + "://(unparseable)"
		}
		return "(unparseable)"
	}
	if u.Opaque != "" {
		// "redis:user:secret@host" or "user:secret@host:6379" (no "//"):
		// whatever follows the first colon may hold the password.
		return u.Scheme + ":(opaque)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	for k := range q {
		if strings.Contains(strings.ToLower(k), "pass") {
			q.Set(k, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}
