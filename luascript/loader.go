package luascript

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Loader puts the scripts into Redis before the calls need them, node by
// node, so that a decision never waits for a script to cross the link and
// no call ever carries a script's text:
//
//   - Connected checks every script on a node (one SCRIPT EXISTS) and loads
//     those it lacks (SCRIPT LOAD, in one round trip). The store calls it
//     for every node when it connects, for a node again whenever a new
//     connection to it is made (a restart empties the script cache), and
//     for every node, replicas included, when a Cluster's slot map changes:
//     Redis does not copy scripts to replicas, so each replica is loaded
//     while it is one, and a promoted replica already holds them.
//   - A call sent through Client that a node answers NOSCRIPT (a SCRIPT
//     FLUSH, or a node that was never checked) has that one script loaded
//     on that node, then is sent again as EVALSHA if its deadline leaves a
//     round trip; NOSCRIPT means the call ran nothing, so nothing runs
//     twice. Only the script that was missing crosses the link: loading
//     every script (about 660 KB) over a slow link would itself be the
//     outage.
//
// Every load is single flight: the calls and checks that need a script on
// a node while it is being loaded there wait for that load, within their
// own deadlines, and a load runs to its end (under its own timeout) even
// when they stop waiting. So a flush costs each node one load of each
// script the calls need, whatever the number of calls.
type Loader struct {
	ctx     context.Context // ends the loads in flight (Close)
	stop    context.CancelFunc
	timeout time.Duration
	report  func(LoadReport)
	wg      sync.WaitGroup

	mu     sync.Mutex
	closed bool
	nodes  map[string]*nodeScripts
	// flying counts the loads in flight, so that a call checks for one
	// only while there is one.
	flying atomic.Int64

	client atomic.Pointer[loadingClient]
}

// LoaderOptions configures NewLoader.
type LoaderOptions struct {
	// Timeout bounds each check and load of a node: long enough for the
	// scripts to cross the slowest link the sidecar must survive. Zero
	// means 30 seconds.
	Timeout time.Duration
	// Report, when set, is told of every check or load that loaded
	// scripts or failed, on the loader's goroutine; it must not block.
	Report func(LoadReport)
}

// LoadReport is what one check or load of a node did.
type LoadReport struct {
	Addr string
	// Why: "connect" for a check of a node the client (re)connected to,
	// "noscript" for a load after a call found a script missing.
	Why     string
	Scripts int // scripts loaded
	Bytes   int // their text, as sent
	Err     error
}

// Reasons of a load (LoadReport.Why).
const (
	LoadConnect  = "connect"
	LoadNoScript = "noscript"
)

// nodeScripts is what the loader knows of one node's script cache.
type nodeScripts struct {
	// loadedAt is when a load of each script (by SHA1) was last answered:
	// a call sent before it that found the script missing is sent again
	// without loading it again.
	loadedAt map[string]time.Time
	flights  map[string]*flight // loads in flight, by SHA1
	// refused are the scripts Redis refused to load (an ACL without
	// SCRIPT LOAD; a flags line the embedded store cannot compile), until
	// the node is connected again.
	refused map[string]error
	// checking: a check (Connected) runs; again: run it once more after.
	checking, again bool
	// checked: a check of the node ended (the first loads every script
	// without asking which Redis holds: it runs before any traffic).
	checked bool

	// conn is the node's connection of the loads after the first (nil
	// until one needs it, or after it failed), so that on a slow link no
	// call and no health probe waits behind a script's text; connMu
	// orders its use. It is made when the first check ends, before any
	// flush needs it.
	connMu  sync.Mutex
	conn    rueidis.DedicatedClient
	release func()
}

// flight is one load of a script on a node; err is set before done closes.
// rtt is the round trip of the call whose NOSCRIPT started it (0 for a
// check's): a call that waited for it is sent only while its deadline
// leaves that much.
type flight struct {
	done chan struct{}
	err  error
	rtt  time.Duration
}

// text is a script text Redis may be asked to run, by the SHA1 the calls
// name it by.
type text struct {
	sha, src string
	// plain is the text without its flags line, for a store that cannot
	// compile it (readOnlyScript); nil when it has none.
	plain *text
}

// texts are every text the calls name, by SHA1: each script's, the batch
// script's, and each peek's text without its flags line; checked are
// those a check makes sure of (the first three, but lazySources).
var texts, checked = func() (map[string]*text, []*text) {
	byShA := map[string]*text{}
	var main []*text
	for _, src := range sources {
		t := &text{sha: sha1Hex(src), src: src}
		if strings.HasPrefix(src, "#!") {
			p := withoutFlags(src)
			t.plain = &text{sha: sha1Hex(p), src: p}
			byShA[t.plain.sha] = t.plain
		}
		byShA[t.sha] = t
		main = append(main, t)
	}
	for _, src := range lazySources {
		byShA[sha1Hex(src)] = &text{sha: sha1Hex(src), src: src}
	}
	return byShA, main
}()

// NewLoader returns a loader; Close stops its loads.
func NewLoader(opts LoaderOptions) *Loader {
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Loader{ctx: ctx, stop: stop, timeout: opts.Timeout, report: opts.Report, nodes: map[string]*nodeScripts{}}
}

// Close ends the loads and checks in flight and waits for them.
func (l *Loader) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.stop()
	l.wg.Wait()
	for _, n := range l.nodes {
		n.connMu.Lock()
		if n.release != nil {
			n.release()
			n.conn, n.release = nil, nil
		}
		n.connMu.Unlock()
	}
}

func (l *Loader) nodeLocked(addr string) *nodeScripts {
	n := l.nodes[addr]
	if n == nil {
		n = &nodeScripts{loadedAt: map[string]time.Time{}, flights: map[string]*flight{}, refused: map[string]error{}}
		l.nodes[addr] = n
	}
	return n
}

// Connected checks, in the background, that node, the client of the Redis
// node at addr alone, holds every script, and loads those it lacks. One
// check of a node runs at a time; a call while one runs has one more run
// after it. It does not block.
func (l *Loader) Connected(addr string, node rueidis.Client) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	n := l.nodeLocked(addr)
	clear(n.refused) // a new connection may be to another server
	if n.checking {
		n.again = true
		return
	}
	n.checking = true
	l.wg.Go(func() {
		for {
			l.check(addr, node, n)
			l.mu.Lock()
			if !n.again || l.closed {
				n.checking, n.again = false, false
				l.mu.Unlock()
				return
			}
			n.again = false
			l.mu.Unlock()
		}
	})
}

// check is one run of Connected for node n.
func (l *Loader) check(addr string, node rueidis.Client, n *nodeScripts) {
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	defer cancel()
	l.mu.Lock()
	first := !n.checked
	l.mu.Unlock()
	if first {
		// A sidecar that just started: load every script at once, one
		// round trip sooner than asking first, before the first calls.
		if l.load(ctx, addr, node, checked, LoadConnect, 0) == nil {
			l.mu.Lock()
			n.checked = true
			l.mu.Unlock()
			n.connMu.Lock()
			l.dedicate(n, node)
			n.connMu.Unlock()
		}
		return
	}
	shas := make([]string, len(checked))
	for i, t := range checked {
		shas[i] = t.sha
	}
	missing := checked
	exists, err := node.Do(ctx, node.B().ScriptExists().Sha1(shas...).Build()).AsIntSlice()
	switch _, reply := rueidis.IsRedisErr(err); {
	case err == nil && len(exists) == len(checked):
		missing = nil
		for i, v := range exists {
			if v == 0 {
				missing = append(missing, checked[i])
			}
		}
	case reply:
		// An ACL without SCRIPT EXISTS: load them all.
	default:
		if l.ctx.Err() == nil {
			l.reportf(LoadReport{Addr: addr, Why: LoadConnect, Err: fmt.Errorf("script exists on %s: %w", addr, err)})
		}
		return
	}
	if len(missing) > 0 {
		_ = l.load(ctx, addr, node, missing, LoadConnect, 0)
	}
}

// ensure has the script named sha loaded on node (at addr) after a call
// sent at sent found it missing there: at once when a load of it was
// answered since sent, else after the load in flight or a new one. It
// returns ctx's error when ctx ends first, and a *refusedError when Redis
// refuses to load it.
func (l *Loader) ensure(ctx context.Context, addr string, node rueidis.Client, t *text, sent time.Time) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrNotLoaded
	}
	n := l.nodeLocked(addr)
	if at, ok := n.loadedAt[t.sha]; ok && at.After(sent) {
		l.mu.Unlock()
		return nil
	}
	if err := n.refused[t.sha]; err != nil {
		l.mu.Unlock()
		return err
	}
	l.mu.Unlock()
	return l.load(ctx, addr, node, []*text{t}, LoadNoScript, time.Since(sent))
}

// landing waits, before a call of t is sent to node addr, for a load of
// t in flight there, so that the call is not sent only to be answered
// NOSCRIPT, and returns errWaited when it did. It returns ErrNotLoaded
// when ctx ends first, or leaves less than the round trip of the call
// that started the load: the call is then not sent.
func (l *Loader) landing(ctx context.Context, addr string, t *text) error {
	if l.flying.Load() == 0 {
		return nil
	}
	l.mu.Lock()
	var f *flight
	if n := l.nodes[addr]; n != nil {
		f = n.flights[t.sha]
	}
	l.mu.Unlock()
	if f == nil {
		return nil
	}
	select {
	case <-f.done:
		// A failed load shows as NOSCRIPT, and is handled so.
	case <-ctx.Done():
		return fmt.Errorf("%w (%v)", ErrNotLoaded, ctx.Err())
	}
	if at, ok := ctx.Deadline(); ok && time.Until(at) < f.rtt {
		return fmt.Errorf("%w: the script was loaded too late to send the call", ErrNotLoaded)
	}
	return errWaited
}

// errWaited is landing's report that the call waited for a load: it is
// sent, and its time at Redis begins now.
var errWaited = errors.New("waited for the script's load")

// HeldError is the failure of a call that the loader held back while it
// loaded the call's script (a load in flight, or after NOSCRIPT), with when
// the call was last sent: its time at Redis began then, not when its
// caller handed it over, and a timeout of it says only how Redis answered
// from Sent on.
type HeldError struct {
	Sent time.Time
	Err  error
}

func (e *HeldError) Error() string { return e.Err.Error() }
func (e *HeldError) Unwrap() error { return e.Err }

// SentAt is when the call that failed with err was last sent, when the
// loader held it back (HeldError); the zero time otherwise.
func SentAt(err error) time.Time {
	if he, ok := errors.AsType[*HeldError](err); ok {
		return he.Sent
	}
	return time.Time{}
}

// held marks res, the result of a call the loader held back and sent at
// sent, when it failed short of an answer from Redis.
func held(res rueidis.RedisResult, sent time.Time) rueidis.RedisResult {
	err := res.Error()
	if err == nil || rueidis.IsRedisNil(err) {
		return res
	}
	if _, reply := rueidis.IsRedisErr(err); reply {
		return res
	}
	return rueidis.NewErrorResult(&HeldError{Sent: sent, Err: err})
}

// refusedError is Redis's refusal to load a script.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// load loads ts on node (at addr), joining the loads of them in flight,
// and waits for every one of them, or for ctx. The loads it starts run in
// one round trip on the loader's goroutine, under the loader's timeout;
// rtt is the round trip of the call that asked (0 for none).
func (l *Loader) load(ctx context.Context, addr string, node rueidis.Client, ts []*text, why string, rtt time.Duration) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrNotLoaded
	}
	n := l.nodeLocked(addr)
	var mine []*text
	var mineF, wait []*flight
	for _, t := range ts {
		if f := n.flights[t.sha]; f != nil {
			wait = append(wait, f)
			continue
		}
		f := &flight{done: make(chan struct{}), rtt: rtt}
		n.flights[t.sha] = f
		l.flying.Add(1)
		mine, mineF = append(mine, t), append(mineF, f)
		wait = append(wait, f)
	}
	if len(mine) > 0 {
		// The first loads of a node go before any traffic; the later ones
		// go on a connection of their own, beside the calls and the
		// health probes, so that on a slow link none of them waits behind
		// a script's text.
		dedicated := n.checked
		l.wg.Go(func() { l.send(addr, node, dedicated, n, mine, mineF, why) })
	}
	l.mu.Unlock()
	for _, f := range wait {
		select {
		case <-f.done:
			if f.err != nil {
				return f.err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// send runs the SCRIPT LOADs of ts on node and ends their flights fs.
func (l *Loader) send(addr string, node rueidis.Client, dedicated bool, n *nodeScripts, ts []*text, fs []*flight, why string) {
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	defer cancel()
	cmds := make(rueidis.Commands, len(ts))
	for i, t := range ts {
		cmds[i] = node.B().ScriptLoad().Script(t.src).Build()
	}
	var res []rueidis.RedisResult
	if dedicated {
		n.connMu.Lock()
		for try := 0; try < 2; try++ {
			res = l.dedicate(n, node).DoMulti(ctx, cmds...)
			if !lost(res) {
				break
			}
			// Lost (Redis restarted since it was made), or timed out
			// mid-reply: once more on a new one while time is left.
			n.release()
			n.conn, n.release = nil, nil
			if ctx.Err() != nil {
				break
			}
		}
		n.connMu.Unlock()
	} else {
		res = node.DoMulti(ctx, cmds...)
	}
	report := LoadReport{Addr: addr, Why: why}
	for i, t := range ts {
		err := loaded(res[i], t)
		if re, ok := rueidis.IsRedisErr(err); ok && t.plain != nil && strings.HasPrefix(re.Error(), "Error compiling script") {
			// A store that does not parse a shebang's flags (the embedded
			// one) runs the peek without them (readOnlyScript): no failure
			// worth reporting.
			plain := loaded(node.Do(ctx, node.B().ScriptLoad().Script(t.plain.src).Build()), t.plain)
			if plain = l.settle(n, t.plain, nil, plain, &report, addr); plain != nil && report.Err == nil {
				report.Err = plain
			}
			fs[i].err = l.settle(n, t, fs[i], err, &report, addr)
		} else if fs[i].err = l.settle(n, t, fs[i], err, &report, addr); fs[i].err != nil && report.Err == nil {
			report.Err = fs[i].err
		}
		close(fs[i].done)
	}
	if l.ctx.Err() == nil && (report.Scripts > 0 || report.Err != nil) {
		l.reportf(report)
	}
}

// settle records the outcome err of a load of t on n (at addr), the load
// of flight f (nil for none), and returns what the calls waiting for it
// get: nil, a *refusedError for Redis's refusal, or the failure.
func (l *Loader) settle(n *nodeScripts, t *text, f *flight, err error, report *LoadReport, addr string) error {
	if err != nil {
		err = fmt.Errorf("script load on %s: %w", addr, err)
		if _, reply := rueidis.IsRedisErr(errors.Unwrap(err)); reply {
			err = &refusedError{err}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch err.(type) {
	case nil:
		n.loadedAt[t.sha] = time.Now()
		report.Scripts++
		report.Bytes += len(t.src)
	case *refusedError:
		n.refused[t.sha] = err
	}
	if f != nil && n.flights[t.sha] == f {
		delete(n.flights, t.sha)
		l.flying.Add(-1)
	}
	return err
}

// lost reports whether a reply of res is a transport failure, not one of
// Redis's.
func lost(res []rueidis.RedisResult) bool {
	for _, r := range res {
		if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
			if _, reply := rueidis.IsRedisErr(err); !reply {
				return true
			}
		}
	}
	return false
}

// dedicate returns n's connection of its own, made first if needed; the
// caller holds n.connMu.
func (l *Loader) dedicate(n *nodeScripts, node rueidis.Client) rueidis.DedicatedClient {
	if n.conn == nil {
		n.conn, n.release = node.Dedicate()
	}
	return n.conn
}

// loaded checks the reply to the SCRIPT LOAD of t.
func loaded(res rueidis.RedisResult, t *text) error {
	sha, err := res.ToString()
	if err != nil {
		return err
	}
	if sha != t.sha {
		return fmt.Errorf("redis named the script %s, want %s", sha, t.sha)
	}
	return nil
}

func (l *Loader) reportf(r LoadReport) {
	if l.report != nil {
		l.report(r)
	}
}

// Client returns c, through which calls are sent, with NOSCRIPT handled
// by the loader: a call that a node answers NOSCRIPT has its script loaded
// there once (ensure) and is sent again as EVALSHA when its deadline
// leaves as long as the first attempt took; otherwise its result is
// ErrNotLoaded, and it did not run. A node whose Redis refuses to load
// the script keeps the NOSCRIPT reply, on which the calls send the text
// (EVAL), as without a loader. nodeOf names the node that serves a hash
// slot ("" for unknown; a client of one node needs none). The wrapper is
// reused while c and nodeOf's owner stay the same.
func (l *Loader) Client(c rueidis.Client, nodeOf func(slot uint16) string) rueidis.Client {
	if w := l.client.Load(); w != nil && w.Client == c {
		return w
	}
	w := &loadingClient{Client: c, l: l, nodeOf: nodeOf}
	l.client.Store(w)
	return w
}

// loadingClient is a rueidis.Client whose Do and DoMulti handle NOSCRIPT
// (Loader.Client); every other method goes to the wrapped client.
type loadingClient struct {
	rueidis.Client
	l      *Loader
	nodeOf func(slot uint16) string
}

// evalsha reports the script text that cmd, an EVALSHA or EVALSHA_RO of
// one of the package's scripts, names; nil for any other command.
func evalsha(cmd rueidis.Completed) *text {
	args := cmd.Commands()
	if len(args) < 2 || args[0] != "EVALSHA" && args[0] != "EVALSHA_RO" {
		return nil
	}
	return texts[args[1]]
}

func noScript(res rueidis.RedisResult) bool {
	re, ok := rueidis.IsRedisErr(res.Error())
	return ok && re.IsNoScript()
}

func (c *loadingClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	t := evalsha(cmd)
	if t == nil {
		return c.Client.Do(ctx, cmd)
	}
	waited := false
	if err := c.landed(ctx, cmd, t); err == errWaited {
		waited = true
	} else if err != nil {
		return rueidis.NewErrorResult(err)
	}
	// Pinned, so that it can be sent again after the first reply.
	cmd = cmd.Pin()
	sent := time.Now()
	res := c.Client.Do(ctx, cmd)
	if !noScript(res) {
		if waited {
			return held(res, sent)
		}
		return res
	}
	if err := c.reload(ctx, cmd, t, sent); err != nil {
		if errors.As(err, new(*refusedError)) {
			return res
		}
		return rueidis.NewErrorResult(err)
	}
	resent := time.Now()
	return held(c.Client.Do(ctx, cmd), resent)
}

func (c *loadingClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	var ts []*text // by index of cmds; nil while no call is an EVALSHA
	for i := range cmds {
		if t := evalsha(cmds[i]); t != nil {
			if ts == nil {
				ts = make([]*text, len(cmds))
			}
			ts[i] = t
			cmds[i] = cmds[i].Pin()
		}
	}
	waited := false
	if ts != nil && c.l.flying.Load() > 0 {
		for i, t := range ts {
			if t == nil {
				continue
			}
			if err := c.landed(ctx, cmds[i], t); err == errWaited {
				waited = true
			} else if err != nil {
				// Not sent: every call's result is that it did not run.
				res := make([]rueidis.RedisResult, len(cmds))
				for j := range res {
					res[j] = rueidis.NewErrorResult(err)
				}
				return res
			}
		}
	}
	sent := time.Now()
	res := c.Client.DoMulti(ctx, cmds...)
	if ts == nil {
		return res
	}
	if waited {
		for i := range res {
			res[i] = held(res[i], sent)
		}
	}
	var again []int
	for i, t := range ts {
		if t == nil || !noScript(res[i]) {
			continue
		}
		if err := c.reload(ctx, cmds[i], t, sent); err != nil {
			if !errors.As(err, new(*refusedError)) {
				res[i] = rueidis.NewErrorResult(err)
			}
			continue
		}
		again = append(again, i)
	}
	if len(again) == 0 {
		return res
	}
	resend := make(rueidis.Commands, len(again))
	for j, i := range again {
		resend[j] = cmds[i]
	}
	resent := time.Now()
	for j, r := range c.Client.DoMulti(ctx, resend...) {
		res[again[j]] = held(r, resent)
	}
	return res
}

// reload has t loaded on the node that answered cmd, sent at sent,
// NOSCRIPT, and reports whether cmd may be sent again: nil when it may,
// ErrNotLoaded (wrapping why) when the load did not end in time or its
// deadline no longer leaves a round trip as long as the first, a
// *refusedError when Redis refused to load it or the node is unknown.
func (c *loadingClient) reload(ctx context.Context, cmd rueidis.Completed, t *text, sent time.Time) error {
	rtt := time.Since(sent)
	addr, node := c.node(cmd)
	if node == nil {
		return &refusedError{errors.New("the node that answered NOSCRIPT is not known")}
	}
	if err := c.l.ensure(ctx, addr, node, t, sent); err != nil {
		if errors.As(err, new(*refusedError)) {
			return err
		}
		// %v: the load's running out is not the call's, which did not run.
		return fmt.Errorf("%w (%v)", ErrNotLoaded, err)
	}
	if at, ok := ctx.Deadline(); ok && time.Until(at) < rtt {
		return fmt.Errorf("%w: the script was loaded too late to send the call again", ErrNotLoaded)
	}
	return nil
}

// landed waits for a load of t in flight on the node that serves cmd
// (Loader.landing); errWaited when it did.
func (c *loadingClient) landed(ctx context.Context, cmd rueidis.Completed, t *text) error {
	if c.l.flying.Load() == 0 {
		return nil
	}
	addr, _ := c.node(cmd)
	if addr == "" {
		return nil
	}
	return c.l.landing(ctx, addr, t)
}

// node is the address and the client of the node that serves cmd.
func (c *loadingClient) node(cmd rueidis.Completed) (string, rueidis.Client) {
	nodes := c.Client.Nodes()
	if c.nodeOf != nil {
		if addr := c.nodeOf(cmd.Slot()); addr != "" {
			return addr, nodes[addr]
		}
	}
	if len(nodes) == 1 {
		for addr, node := range nodes {
			return addr, node
		}
	}
	return "", nil
}
