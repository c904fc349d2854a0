package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"quotad/protocol"
)

// Config describes one load run. Zero values take the defaults noted.
type Config struct {
	Socket   string
	Conns    int           // client connections; default 1
	InFlight int           // requests each connection keeps outstanding; default 1
	Duration time.Duration // how long requests are sent; default 10s
	// Subjects is how many distinct subjects the takes spread over, chosen
	// at random per request; default 1000.
	Subjects int
	// SubjectPrefix starts every subject, so that runs need not share
	// windows; default "bench-".
	SubjectPrefix string
	// Policy names a policy of the sidecar's config; otherwise the limits
	// of Algorithm are sent inline.
	Policy string
	// Algorithm of the inline limits: "" or "fixed_window" sends Limit and
	// WindowMS (and no algorithm field, the protocol's default);
	// "token_bucket" sends Rate, PeriodMS and Burst (when not 0);
	// "concurrency" sends Limit and LeaseMS, and needs RequestIDs and a
	// Cost of 1 (each take acquires a lease of its own, which lives LeaseMS);
	// "sliding_window" sends Limit and WindowMS; "calendar" sends Limit,
	// Period and TimeZone (when not "").
	Algorithm string
	Period    string // calendar: minute, hour, day, week or month
	TimeZone  string // calendar: an IANA zone; "" is UTC
	Limit     int64
	WindowMS  int64
	Rate      int64
	PeriodMS  int64
	Burst     int64
	LeaseMS   int64
	Cost      int64 // default 1
	// Checks, when 2 or more, makes every take a take of that many checks
	// (all-or-nothing), each with the limits above and a subject of its
	// own at random: check i's subjects are SubjectPrefix, i, "-" and a
	// number, so two checks never share a counter. Not with Release.
	Checks int
	// RequestIDs gives every take a unique request_id.
	RequestIDs bool
	// Release follows every lease a concurrency take acquired with its
	// release, on the same connection once the take's reply is read, as a
	// client holding a lease for a round trip would. About half the
	// requests are then releases; Result counts their replies apart.
	Release bool
	// Progress, when not nil, gets one line per ProgressEvery (default 1s)
	// while the run lasts.
	Progress      io.Writer
	ProgressEvery time.Duration
}

func (c *Config) defaults() error {
	c.Conns = max(c.Conns, 1)
	c.InFlight = max(c.InFlight, 1)
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Subjects <= 0 {
		c.Subjects = 1000
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = "bench-"
	}
	if c.Cost <= 0 {
		c.Cost = 1
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = time.Second
	}
	if c.Socket == "" {
		return errors.New("loadgen: a socket path is required")
	}
	if c.Release && (!c.RequestIDs || c.Policy == "" && c.Algorithm != "concurrency") {
		return errors.New("loadgen: releases are of concurrency leases, taken with request ids")
	}
	if c.Checks < 0 || c.Checks == 1 || c.Checks > 0 && c.Release {
		return errors.New("loadgen: a take of checks has 2 or more, and no releases")
	}
	inline := c.Limit != 0 || c.WindowMS != 0 || c.Rate != 0 || c.PeriodMS != 0 || c.Burst != 0 || c.LeaseMS != 0 ||
		c.Period != "" || c.TimeZone != ""
	if c.Policy != "" {
		if inline || c.Algorithm != "" {
			return errors.New("loadgen: give a policy or inline limits, not both")
		}
		return nil
	}
	switch c.Algorithm {
	case "", "fixed_window", "sliding_window":
		if c.Limit <= 0 || c.WindowMS <= 0 || c.Rate != 0 || c.PeriodMS != 0 || c.Burst != 0 || c.LeaseMS != 0 || c.Period != "" || c.TimeZone != "" {
			return errors.New("loadgen: give a policy, or an inline limit and window_ms")
		}
	case "calendar":
		if c.Limit <= 0 || c.Period == "" || c.WindowMS != 0 || c.Rate != 0 || c.PeriodMS != 0 || c.Burst != 0 || c.LeaseMS != 0 {
			return errors.New("loadgen: a calendar window takes a limit and a period, and optionally a time zone")
		}
	case "token_bucket":
		if c.Rate <= 0 || c.PeriodMS <= 0 || c.Burst < 0 || c.Limit != 0 || c.WindowMS != 0 || c.LeaseMS != 0 {
			return errors.New("loadgen: a token bucket takes a rate and period_ms, and optionally a burst")
		}
	case "concurrency":
		switch {
		case c.Limit <= 0 || c.LeaseMS <= 0 || c.WindowMS != 0 || c.Rate != 0 || c.PeriodMS != 0 || c.Burst != 0:
			return errors.New("loadgen: concurrency takes a limit and lease_ms")
		case !c.RequestIDs || c.Cost != 1:
			return errors.New("loadgen: concurrency takes need request ids (they name the leases) and a cost of 1")
		}
	default:
		return fmt.Errorf("loadgen: unknown algorithm %q: fixed_window, token_bucket, concurrency, sliding_window or calendar", c.Algorithm)
	}
	return nil
}

// Result is what the clients saw.
type Result struct {
	Replies  int64 // replies read, of every kind
	Elapsed  time.Duration
	Allowed  int64 // accepted takes, replays excluded
	Replays  int64
	Denied   int64
	Releases int64                   // release replies (Config.Release)
	Released int64                   // of them, those that freed a lease
	Errors   map[protocol.Code]int64 // error replies by code
	P50, P90 time.Duration           // latency from writing a line to reading its reply
	P99      time.Duration
	P999     time.Duration
}

// Rate is replies per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Replies) / r.Elapsed.Seconds()
}

// ErrorCount is the number of error replies.
func (r Result) ErrorCount() int64 {
	var n int64
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// WriteText prints the result for people.
func (r Result) WriteText(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "decisions  %d in %.2fs: %.0f decisions/s\n", r.Replies, r.Elapsed.Seconds(), r.Rate())
	fmt.Fprintf(&b, "latency    p50 %v  p90 %v  p99 %v  p99.9 %v\n", r.P50, r.P90, r.P99, r.P999)
	fmt.Fprintf(&b, "results    allowed %d  denied %d  replay %d  error %d\n", r.Allowed, r.Denied, r.Replays, r.ErrorCount())
	if r.Releases > 0 {
		fmt.Fprintf(&b, "releases   %d  freed a lease %d\n", r.Releases, r.Released)
	}
	codes := make([]string, 0, len(r.Errors))
	for c := range r.Errors {
		codes = append(codes, string(c))
	}
	sort.Strings(codes)
	for _, c := range codes {
		fmt.Fprintf(&b, "  error    %-16s %d\n", c, r.Errors[protocol.Code(c)])
	}
	_, err := w.Write(b.Bytes())
	return err
}

// Run opens cfg.Conns connections, keeps cfg.InFlight takes outstanding on
// each for cfg.Duration, then reads the last replies and returns the
// counts. A connection that fails ends the run with an error; the result
// still holds what was counted. Cancelling ctx stops sending early.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	if useLoop {
		return runLoop(ctx, &cfg)
	}
	clients := make([]*client, cfg.Conns)
	for i := range clients {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", cfg.Socket)
		if err != nil {
			for _, c := range clients[:i] {
				c.nc.Close()
			}
			return Result{}, fmt.Errorf("loadgen: connect to %s: %w", cfg.Socket, err)
		}
		clients[i] = newClient(&cfg, i)
		clients[i].nc = nc.(*net.UnixConn)
	}

	// A cancelled run must not wait for a sidecar that stopped answering.
	stopClose := context.AfterFunc(ctx, func() {
		for _, c := range clients {
			c.nc.Close()
		}
	})
	defer stopClose()
	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(2)
		go func() { defer wg.Done(); c.writeLoop(runCtx) }()
		go func() { defer wg.Done(); c.readLoop() }()
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		progress(&cfg, clients, start, stopProgress)
	}()
	wg.Wait()
	elapsed := time.Since(start)
	close(stopProgress)
	<-progressDone
	for _, c := range clients {
		c.nc.Close()
	}
	return collect(clients, elapsed)
}

// collect adds up what the clients counted.
func collect(clients []*client, elapsed time.Duration) (Result, error) {
	res := Result{Elapsed: elapsed, Errors: map[protocol.Code]int64{}}
	var h histogram
	var errs []error
	for _, c := range clients {
		res.Replies += c.replies.Load()
		res.Allowed += c.allowed
		res.Replays += c.replays
		res.Denied += c.denied
		res.Releases += c.releases
		res.Released += c.released
		for code, n := range c.errors {
			res.Errors[code] += n
		}
		h.merge(&c.lat)
		if c.err != nil {
			errs = append(errs, c.err)
		}
	}
	res.P50, res.P90, res.P99, res.P999 = h.quantile(0.50), h.quantile(0.90), h.quantile(0.99), h.quantile(0.999)
	return res, errors.Join(errs...)
}

func progress(cfg *Config, clients []*client, start time.Time, stop <-chan struct{}) {
	if cfg.Progress == nil {
		return
	}
	t := time.NewTicker(cfg.ProgressEvery)
	defer t.Stop()
	var last int64
	lastAt := start
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			var n, bad int64
			for _, c := range clients {
				n += c.replies.Load()
				bad += c.bad.Load()
			}
			rate := float64(n-last) / now.Sub(lastAt).Seconds()
			fmt.Fprintf(cfg.Progress, "%6.1fs  %9.0f decisions/s  %10d replies  %d errors\n", now.Sub(start).Seconds(), rate, n, bad)
			last, lastAt = n, now
		}
	}
}

// client is one connection: a writer that keeps up to InFlight requests
// outstanding and a reader that matches replies to them by order.
type client struct {
	cfg  *Config
	id   int
	nc   *net.UnixConn
	rng  *rand.Rand
	room chan struct{}  // one token per request that may still be sent
	sent chan time.Time // send times of outstanding requests, oldest first
	// With Config.Release: the outstanding requests' leases, oldest first,
	// and the leases granted and not yet released. Neither ever holds more
	// than InFlight: a granted lease waits for a free place to be sent in.
	leases, granted chan lease

	replies atomic.Int64
	bad     atomic.Int64 // error replies, for the progress line
	// Owned by the reader until Run merges them.
	allowed, replays, denied int64
	releases, released       int64
	errors                   map[protocol.Code]int64
	lat                      histogram
	err                      error
}

func newClient(cfg *Config, id int) *client {
	c := &client{
		cfg:    cfg,
		id:     id,
		rng:    rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano()))),
		room:   make(chan struct{}, cfg.InFlight),
		sent:   make(chan time.Time, cfg.InFlight),
		errors: map[protocol.Code]int64{},
	}
	for range cfg.InFlight {
		c.room <- struct{}{}
	}
	if cfg.Release {
		c.leases = make(chan lease, cfg.InFlight)
		c.granted = make(chan lease, cfg.InFlight)
	}
	return c
}

// lease is what a request was: a take of a subject, whose request id is
// made of seq, or the release of such a take's lease.
type lease struct {
	subject, seq uint64
	release      bool
}

// writeLoop sends as many requests as there is room for in one write, as a
// pipelining client does. When the run ends it shuts its half of the
// connection: the sidecar answers what it read and closes, which ends the
// reader after the last reply.
func (c *client) writeLoop(ctx context.Context) {
	defer func() { _ = c.nc.CloseWrite() }()
	var buf []byte
	var seq uint64
	for {
		select {
		case <-c.room:
		case <-ctx.Done():
			return
		}
		if ctx.Err() != nil {
			return
		}
		n := 1
	more:
		for n < c.cfg.InFlight {
			select {
			case <-c.room:
				n++
			default:
				break more
			}
		}
		buf = buf[:0]
		for range n {
			seq++
			buf = c.appendRequest(buf, seq)
		}
		now := time.Now()
		for range n {
			c.sent <- now // never blocks: room bounds what is outstanding
		}
		if _, err := c.nc.Write(buf); err != nil {
			return // the reader sees the connection fail and reports it
		}
	}
}

// appendRequest appends the next request: the release of a granted lease
// when one waits, else a take of a subject at random.
func (c *client) appendRequest(buf []byte, seq uint64) []byte {
	l := lease{seq: seq}
	if c.granted != nil {
		select {
		case l = <-c.granted:
			l.release = true
		default:
		}
	}
	if !l.release {
		l.subject = c.rng.Uint64N(uint64(c.cfg.Subjects))
	}
	if c.leases != nil {
		c.leases <- l // never blocks: room bounds what is outstanding
	}
	if c.cfg.Checks > 1 {
		return c.appendChecks(buf, l.subject, seq)
	}
	if l.release {
		buf = append(buf, `{"op":"release","subject":"`...)
	} else {
		buf = append(buf, `{"op":"take","subject":"`...)
	}
	buf = append(buf, c.cfg.SubjectPrefix...)
	buf = strconv.AppendUint(buf, l.subject, 10)
	buf = append(buf, '"')
	if c.cfg.Policy != "" {
		buf = append(buf, `,"policy":"`...)
		buf = append(buf, c.cfg.Policy...)
		buf = append(buf, '"')
	} else {
		buf = c.appendLimits(buf)
	}
	if c.cfg.Cost != 1 && !l.release {
		buf = append(buf, `,"cost":`...)
		buf = strconv.AppendInt(buf, c.cfg.Cost, 10)
	}
	if c.cfg.RequestIDs {
		buf = c.appendRequestID(buf, l.seq)
	}
	return append(buf, "}\n"...)
}

func (c *client) appendRequestID(buf []byte, seq uint64) []byte {
	buf = append(buf, `,"request_id":"`...)
	buf = append(buf, c.cfg.SubjectPrefix...)
	buf = strconv.AppendInt(buf, int64(c.id), 36)
	buf = append(buf, '-')
	buf = strconv.AppendUint(buf, seq, 36)
	return append(buf, '"')
}

// appendChecks appends a take of Config.Checks checks: the first of
// subject, the others of subjects at random.
func (c *client) appendChecks(buf []byte, subject, seq uint64) []byte {
	buf = append(buf, `{"op":"take","checks":[`...)
	for i := range c.cfg.Checks {
		if i > 0 {
			buf = append(buf, ',')
			subject = c.rng.Uint64N(uint64(c.cfg.Subjects))
		}
		buf = append(buf, `{"subject":"`...)
		buf = append(buf, c.cfg.SubjectPrefix...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, '-')
		buf = strconv.AppendUint(buf, subject, 10)
		buf = append(buf, '"')
		if c.cfg.Policy != "" {
			buf = append(buf, `,"policy":"`...)
			buf = append(buf, c.cfg.Policy...)
			buf = append(buf, '"')
		} else {
			buf = c.appendLimits(buf)
		}
		if c.cfg.Cost != 1 {
			buf = append(buf, `,"cost":`...)
			buf = strconv.AppendInt(buf, c.cfg.Cost, 10)
		}
		buf = append(buf, '}')
	}
	buf = append(buf, ']')
	if c.cfg.RequestIDs {
		buf = c.appendRequestID(buf, seq)
	}
	return append(buf, "}\n"...)
}

// appendLimits writes the inline limits of the configured algorithm.
func (c *client) appendLimits(buf []byte) []byte {
	field := func(buf []byte, name string, v int64) []byte {
		buf = append(buf, `,"`...)
		buf = append(buf, name...)
		buf = append(buf, `":`...)
		return strconv.AppendInt(buf, v, 10)
	}
	switch c.cfg.Algorithm {
	case "token_bucket":
		buf = append(buf, `,"algorithm":"token_bucket"`...)
		buf = field(buf, "rate", c.cfg.Rate)
		buf = field(buf, "period_ms", c.cfg.PeriodMS)
		if c.cfg.Burst != 0 {
			buf = field(buf, "burst", c.cfg.Burst)
		}
	case "concurrency":
		buf = append(buf, `,"algorithm":"concurrency"`...)
		buf = field(buf, "limit", c.cfg.Limit)
		buf = field(buf, "lease_ms", c.cfg.LeaseMS)
	case "sliding_window":
		buf = append(buf, `,"algorithm":"sliding_window"`...)
		buf = field(buf, "limit", c.cfg.Limit)
		buf = field(buf, "window_ms", c.cfg.WindowMS)
	case "calendar":
		// Period and TimeZone are names: no JSON escaping needed.
		buf = append(buf, `,"algorithm":"calendar","period":"`...)
		buf = append(buf, c.cfg.Period...)
		buf = append(buf, '"')
		if c.cfg.TimeZone != "" {
			buf = append(buf, `,"time_zone":"`...)
			buf = append(buf, c.cfg.TimeZone...)
			buf = append(buf, '"')
		}
		buf = field(buf, "limit", c.cfg.Limit)
	default:
		buf = field(buf, "limit", c.cfg.Limit)
		buf = field(buf, "window_ms", c.cfg.WindowMS)
	}
	return buf
}

func (c *client) readLoop() {
	lr := protocol.NewLineReader(c.nc, 64<<10, 1<<20)
	for {
		line, err := lr.ReadLine()
		if err != nil {
			if n := len(c.sent); n > 0 || !errors.Is(err, io.EOF) {
				c.err = fmt.Errorf("loadgen: connection %d: read with %d replies outstanding: %w", c.id, n, err)
			}
			return
		}
		var at time.Time
		select {
		case at = <-c.sent:
		default:
			c.err = fmt.Errorf("loadgen: connection %d: a reply to no request: %q", c.id, line)
			return
		}
		c.lat.record(time.Since(at))
		c.answered(line)
		c.replies.Add(1)
		c.room <- struct{}{}
	}
}

var (
	okTrue        = []byte(`"ok":true`)
	allowedField  = []byte(`"allowed":`)
	replayField   = []byte(`"replay":`)
	trueValue     = []byte(`true`)
	releasedField = []byte(`"released":`)
	releasedTrue  = []byte(`"released":true`)
	errorField    = []byte(`"error":"`)
)

// answered counts the reply to the oldest outstanding request and, with
// Config.Release, queues the release of the lease it granted.
func (c *client) answered(line []byte) {
	granted := c.count(line)
	if c.leases != nil {
		if l := <-c.leases; granted && !l.release {
			c.granted <- l // never blocks: see client.granted
		}
	}
}

// count classifies a reply by the fields the sidecar writes in a fixed
// order (see protocol.AppendTake and AppendRelease), without decoding the
// JSON, and reports whether it granted a take (replays excluded). A take
// of checks has the take's own fields first, then each check's: the first
// allowed and replay are the take's.
func (c *client) count(line []byte) (granted bool) {
	first := func(field, value []byte) bool {
		i := bytes.Index(line, field)
		return i >= 0 && bytes.HasPrefix(line[i+len(field):], value)
	}
	switch {
	case bytes.Contains(line, okTrue):
		switch {
		case bytes.Contains(line, releasedField):
			c.releases++
			if bytes.Contains(line, releasedTrue) {
				c.released++
			}
		case first(replayField, trueValue):
			c.replays++
		case first(allowedField, trueValue):
			c.allowed++
			return true
		default:
			c.denied++
		}
	default:
		c.bad.Add(1)
		code := protocol.Code("MALFORMED_REPLY")
		if i := bytes.Index(line, errorField); i >= 0 {
			rest := line[i+len(errorField):]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				code = protocol.Code(rest[:j])
			}
		}
		c.errors[code]++
	}
	return false
}
