package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"quotad/keyslot"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// keyNode is the log key of a Cluster node's address.
const keyNode = "redis_node"

// clusterFastRead is how often the slot map is read while a node that owns
// slots is down or its owners are not all known to be up, and at most how
// soon a call that found the map stale (CLUSTERDOWN, MOVED, a failure to
// reach a node) has it read again. A replica's promotion shows in the
// breakers within this time, not the probe interval.
const clusterFastRead = 100 * time.Millisecond

// clusterFastFor bounds the fast reads: they stop this long after a node
// went down or the map last changed, so that a master that stays down
// without a replica to promote costs a read per probe interval, not ten a
// second. It is above a failover's duration with the default
// cluster-node-timeout of 15s.
const clusterFastFor = time.Minute

// maxRoutingRefresh bounds how often rueidis re-reads its slot map by
// itself (ClusterOption.ShardsRefreshInterval). Each read runs after a
// random delay of up to 1s, so calls stop going to a dead or hung master
// at most this plus 1s after its replica's promotion.
const maxRoutingRefresh = 500 * time.Millisecond

func routingRefresh(probeInterval time.Duration) time.Duration {
	return min(probeInterval, maxRoutingRefresh)
}

// slotCount is the number of hash slots of a Redis Cluster.
const slotCount = keyslot.Count

// clusterHealth is the health of a Redis Cluster, node by node: the slot
// map as the nodes report it (CLUSTER SLOTS, which quotad's ACL allows) and
// a breaker for each master that owns slots. Only the slot owners
// are probed, one PING each through the client's connection to that node,
// so a seed address of --redis-url that has left the cluster is never
// probed and never stops a slot.
//
// rueidis routes each call by its own copy of the map, which it refreshes
// after MOVED, CLUSTERDOWN or a failed connection, and every
// routingRefresh, each time a random delay of up to a second later. Reading the map here as well lets Admit refuse only the
// slots of a node that is down, and allow them again as soon as a node names
// the promoted replica. The probe's PING of a dead master, and one more
// when it loses its slots, fail to connect, which is what makes rueidis
// refresh its own map without waiting for a request to fail on it.
type clusterHealth struct {
	log           *zap.Logger
	topologyLevel zapcore.Level // Store.topologyLevel
	every         time.Duration // the probe interval: each owner's damping counts these
	timeout       time.Duration // bounds every read and PING
	// staleFor is how long after a slot changed owner rueidis may still
	// route calls on it to the previous owner: its periodic refresh, the
	// random delay before a refresh runs (up to 1s), and a call's deadline.
	staleFor time.Duration

	slots atomic.Pointer[slotMap]
	// allOwnersUp and someOwnerUp summarise the owners' breakers for Up
	// and Client; sumMu orders their updates.
	allOwnersUp atomic.Bool
	someOwnerUp atomic.Bool
	sumMu       sync.Mutex
	// stale asks the run loop to read the slot map at its next fast tick.
	stale atomic.Bool
	// fastUntil (UnixNano) is when the fast reads stop: clusterFastFor
	// after a node last went down or the map last changed.
	fastUntil atomic.Int64
	// from is the node that answered the last read (run goroutine only).
	from string
	// pings are the PINGs in flight; run waits for them before it returns.
	pings sync.WaitGroup
	// mapChanged, when set, is called when a new slot map is published,
	// and newNode when the client first knows a node (a replica that
	// joined or finished its sync shows only there: the slot map names
	// the masters).
	mapChanged func()
	newNode    func(addr string)
	known      map[string]bool // the nodes the client knew (run goroutine only)
}

// slotMap is one reading of the cluster's slot owners; never changed once
// published.
type slotMap struct {
	slots  [slotCount]*clusterNode // nil for a slot nobody serves
	owners []*clusterNode          // each owner once, in address order
	byAddr map[string]*clusterNode
	// prev is the owner of each slot in the map before this one, where it
	// changed, and at when this map was read: see clusterHealth.observe.
	prev [slotCount]*clusterNode
	at   time.Time
}

// clusterNode is a master that owns slots, with its own breaker.
type clusterNode struct {
	addr string
	breaker
	downErr error       // what Admit returns while the breaker is open
	pinging atomic.Bool // a PING of the node is in flight
}

// nodeDownError refuses a call whose slot's owner is down. It wraps
// ErrBreakerOpen: the call was not run.
type nodeDownError struct{ addr string }

func (e *nodeDownError) Error() string {
	return "redis node " + e.addr + " is down (breaker open): the request was not run"
}

func (e *nodeDownError) Unwrap() error { return ErrBreakerOpen }

func newClusterHealth(log *zap.Logger, every, timeout, routing time.Duration) *clusterHealth {
	ch := &clusterHealth{log: log, every: every, timeout: timeout, staleFor: routing + time.Second + timeout, known: map[string]bool{}}
	ch.slots.Store(&slotMap{byAddr: map[string]*clusterNode{}})
	return ch
}

func newClusterNode(addr string, every time.Duration) *clusterNode {
	n := &clusterNode{addr: addr, downErr: &nodeDownError{addr: addr}}
	n.damper.every = every
	return n
}

// NodeHealth is the health of one master of a Redis Cluster that owns
// slots, as its breaker sees it.
type NodeHealth struct {
	Addr string
	Up   bool // false while its breaker is open or before it answered
}

// Nodes is the health of every master that owns slots, in address order;
// nil unless the store is a Cluster's.
func (s *Store) Nodes() []NodeHealth {
	ch := s.cluster.Load()
	if ch == nil {
		return nil
	}
	owners := ch.slots.Load().owners
	out := make([]NodeHealth, len(owners))
	for i, n := range owners {
		out[i] = NodeHealth{Addr: n.addr, Up: n.health.Load() == healthUp}
	}
	return out
}

// SlotOwner is the address of the master that serves hash slot slot, as
// the store last read the slot map, or "" when the store is not a
// Cluster's or no master serves the slot.
func (s *Store) SlotOwner(slot uint16) string {
	ch := s.cluster.Load()
	if ch == nil {
		return ""
	}
	if n := ch.slots.Load().slots[slot]; n != nil {
		return n.addr
	}
	return ""
}

// admit is Store.Admit on a Cluster.
func (ch *clusterHealth) admit(key string) error {
	if n := ch.slots.Load().slots[keyslot.Of(key)]; n != nil && n.health.Load() == healthDown {
		return n.downErr
	}
	return nil
}

// allUp reports whether every slot owner is up: the cluster serves every
// slot it has an owner for.
func (ch *clusterHealth) allUp() bool { return ch.allOwnersUp.Load() }

// anyUp reports whether some slot owner is known to be up.
func (ch *clusterHealth) anyUp() bool { return ch.someOwnerUp.Load() }

// lastError names a slot owner that is down and why, or is nil.
func (ch *clusterHealth) lastError() error {
	for _, n := range ch.slots.Load().owners {
		if n.health.Load() != healthDown {
			continue
		}
		if err := n.lastError(); err != nil {
			return fmt.Errorf("redis node %s: %w", n.addr, err)
		}
		return n.downErr
	}
	return nil
}

// observe is Store.Observe on a Cluster. A failure to connect names the
// address it dialled; when that is not the owner this map has for key's
// slot (rueidis routed by an older map), it is that node's failure, not the
// owner's, and the map is read again. A failure that names no node (a
// timeout, a lost connection) counts against the slot's owner, except
// within ch.staleFor of the slot leaving an owner that is down (a
// failover): rueidis may still have sent the call to the old owner, and
// its failure must not stop the promoted replica.
func (ch *clusterHealth) observe(key string, sent time.Time, up bool, err error) {
	m := ch.slots.Load()
	slot := keyslot.Of(key)
	n := m.slots[slot]
	if up {
		if err != nil && mapIsStale(err) {
			ch.stale.Store(true)
		}
		if n != nil {
			ch.set(n, true, false, time.Time{}, nil)
		}
		return
	}
	ch.stale.Store(true)
	if addr := dialedAddr(err); addr != "" {
		if n == nil || n.addr != addr {
			n = m.byAddr[addr]
		}
	} else if p := m.prev[slot]; p != nil && p.health.Load() == healthDown && time.Since(m.at) < ch.staleFor {
		n = p
	}
	if n != nil {
		ch.set(n, false, false, sent, err)
	}
}

// retryDelay is how long rueidis waits before it sends a read-only call
// again after a transport error: rueidis's own exponential delay with
// jitter, except that on a Cluster a node that refused the connection is
// not retried. There rueidis routes by a slot map it refreshes up to a
// second later, so the retries would go to the dead node until the
// deadline, and the deadline would be taken for the slot's new owner
// failing; the refused dial fails the call at once, naming the dead node.
func (s *Store) retryDelay(attempts int, _ rueidis.Completed, err error) time.Duration {
	if s.cluster.Load() != nil && dialedAddr(err) != "" {
		return -1
	}
	base := 1 << min(20, attempts)
	return min(time.Second, time.Duration(base+rand.IntN(base))*time.Microsecond)
}

// mapIsStale reports whether a Redis error reply means the slot map moved.
func mapIsStale(err error) bool {
	var re *rueidis.RedisError
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "CLUSTERDOWN") || strings.HasPrefix(msg, "MOVED") || strings.HasPrefix(msg, "ASK")
}

// dialedAddr is the address a failed connection attempt was to, or "".
func dialedAddr(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" && oe.Addr != nil {
		return oe.Addr.String()
	}
	return ""
}

// set moves n's breaker (see breaker.set), logging and summarising a
// change.
func (ch *clusterHealth) set(n *clusterNode, up, probe bool, sent time.Time, err error) {
	changed, need := n.set(up, probe, sent, err)
	ch.changed(n, changed, up, need, err)
}

func (ch *clusterHealth) probed(n *clusterNode, err error) {
	changed, need := n.breaker.probed(err)
	ch.changed(n, changed, err == nil || isRedisReply(err), need, err)
}

func (ch *clusterHealth) changed(n *clusterNode, changed, up bool, need int, err error) {
	if !changed {
		return
	}
	if up {
		ch.log.Log(ch.topologyLevel, "redis node is up", zap.String(keyNode, n.addr))
	} else {
		ch.readFast()
		ch.log.Warn("redis node is down", zap.String(keyNode, n.addr), zap.Error(err), zap.Int(keyCloseProbes, need))
	}
	ch.summarize()
}

// readFast starts clusterFastFor of fast slot map reads.
func (ch *clusterHealth) readFast() {
	ch.fastUntil.Store(time.Now().Add(clusterFastFor).UnixNano())
}

// summarize recomputes allOwnersUp and someOwnerUp from the current map.
func (ch *clusterHealth) summarize() {
	ch.sumMu.Lock()
	defer ch.sumMu.Unlock()
	owners := ch.slots.Load().owners
	all, some := len(owners) > 0, false
	for _, n := range owners {
		if n.health.Load() == healthUp {
			some = true
		} else {
			all = false
		}
	}
	ch.allOwnersUp.Store(all)
	ch.someOwnerUp.Store(some)
}

// run probes every owner each probe interval, and reads the slot map every
// clusterFastRead while an owner is not up or a call found the map stale,
// for clusterFastFor after a node went down or the map changed.
func (ch *clusterHealth) run(ctx context.Context, c rueidis.Client) {
	defer ch.pings.Wait()
	probe := time.NewTicker(ch.every)
	defer probe.Stop()
	fast := time.NewTicker(clusterFastRead)
	defer fast.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-probe.C:
			ch.probe(ctx, c)
		case <-fast.C:
			if time.Now().UnixNano() >= ch.fastUntil.Load() {
				continue // the probe reads the map
			}
			if ch.stale.Swap(false) || !ch.allUp() {
				ch.readSlots(ctx, c.Nodes())
			}
		}
	}
}

// probe reads the slot map and PINGs every owner, each through the
// client's own connection to it.
func (ch *clusterHealth) probe(ctx context.Context, c rueidis.Client) {
	nodes := c.Nodes()
	for addr := range nodes {
		if !ch.known[addr] {
			ch.known[addr] = true
			if ch.newNode != nil {
				ch.newNode(addr)
			}
		}
	}
	ch.readSlots(ctx, nodes)
	ch.ping(ctx, nodes, ch.slots.Load().owners, true)
}

// ping PINGs each of targets that the client has a connection to, in the
// background, and feeds the outcomes to their breakers when record is set.
// A node whose last PING is still in flight is skipped: one that does not
// answer holds up neither the others nor the reads of the slot map.
func (ch *clusterHealth) ping(ctx context.Context, nodes map[string]rueidis.Client, targets []*clusterNode, record bool) {
	for _, n := range targets {
		nc := nodes[n.addr]
		if nc == nil {
			continue // not in rueidis's map yet: its first call tells
		}
		if !n.pinging.CompareAndSwap(false, true) {
			continue
		}
		ch.pings.Go(func() {
			defer n.pinging.Store(false)
			pctx, cancel := context.WithTimeout(ctx, ch.timeout)
			defer cancel()
			err := nc.Do(pctx, nc.B().Ping().Build()).Error()
			if record && ctx.Err() == nil {
				ch.probed(n, err)
			}
		})
	}
}

// readSlots reads CLUSTER SLOTS from the first node that answers: the one
// that answered last, then the owners not known to be down, then any other
// node the client knows, then the owners that are down. A new map is
// published at once; its new owners are PINGed so that their breakers are
// known, and the old owners that lost every slot are PINGed once more,
// which makes rueidis refresh its own map if they are dead.
func (ch *clusterHealth) readSlots(ctx context.Context, nodes map[string]rueidis.Client) {
	old := ch.slots.Load()
	var order []string
	seen := map[string]bool{}
	add := func(addr string) {
		if !seen[addr] && nodes[addr] != nil {
			seen[addr] = true
			order = append(order, addr)
		}
	}
	if n := old.byAddr[ch.from]; n == nil || n.health.Load() != healthDown {
		add(ch.from)
	}
	for _, n := range old.owners {
		if n.health.Load() != healthDown {
			add(n.addr)
		}
	}
	for addr := range nodes {
		if n := old.byAddr[addr]; n == nil || n.health.Load() != healthDown {
			add(addr)
		}
	}
	for _, n := range old.owners {
		add(n.addr)
	}
	var ranges []slotRange
	read := false
	for _, addr := range order {
		nc := nodes[addr]
		rctx, cancel := context.WithTimeout(ctx, ch.timeout)
		res := nc.Do(rctx, nc.B().ClusterSlots().Build())
		cancel()
		if ctx.Err() != nil {
			return
		}
		var err error
		if ranges, err = parseClusterSlots(res, addr); err == nil {
			ch.from, read = addr, true
			break
		}
	}
	if !read {
		return // no node answered: the PINGs tell the breakers why
	}
	m := buildSlotMap(ranges, old, ch.every)
	if m.slots == old.slots {
		return
	}
	ch.slots.Store(m)
	ch.readFast()
	ch.summarize()
	if ch.mapChanged != nil {
		ch.mapChanged()
	}
	ch.log.Log(ch.topologyLevel, "redis cluster slot map changed", zap.Strings("owners", ownerAddrs(m.owners)))
	var fresh, gone []*clusterNode
	for _, n := range m.owners {
		if n.health.Load() == healthUnknown {
			fresh = append(fresh, n)
		}
	}
	for _, n := range old.owners {
		if m.byAddr[n.addr] == nil {
			gone = append(gone, n)
		}
	}
	ch.ping(ctx, nodes, fresh, true)
	ch.ping(ctx, nodes, gone, false)
}

func ownerAddrs(owners []*clusterNode) []string {
	addrs := make([]string, len(owners))
	for i, n := range owners {
		addrs[i] = n.addr
	}
	return addrs
}

// slotRange is a range of slots, first to last inclusive, and its master.
type slotRange struct {
	first, last int64
	addr        string
}

// parseClusterSlots reads a CLUSTER SLOTS reply that node from sent. A master
// whose host is empty is on from's host, as rueidis reads it too; one whose
// host is "?" is unknown and left out.
func parseClusterSlots(res rueidis.RedisResult, from string) ([]slotRange, error) {
	entries, err := res.ToArray()
	if err != nil {
		return nil, err
	}
	var out []slotRange
	for _, e := range entries {
		v, err := e.ToArray()
		if err != nil || len(v) < 3 {
			continue
		}
		first, err1 := v[0].AsInt64()
		last, err2 := v[1].AsInt64()
		master, err3 := v[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(master) < 2 {
			continue
		}
		host, _ := master[0].ToString()
		port, err := master[1].AsInt64()
		if err != nil || host == "?" {
			continue
		}
		if host == "" {
			host, _, _ = net.SplitHostPort(from)
		}
		out = append(out, slotRange{first: first, last: last, addr: net.JoinHostPort(host, strconv.FormatInt(port, 10))})
	}
	if len(out) == 0 {
		return nil, errors.New("cluster slots: no slot has a master")
	}
	return out, nil
}

// buildSlotMap makes the map of ranges, keeping the breakers of the owners
// old already had.
func buildSlotMap(ranges []slotRange, old *slotMap, every time.Duration) *slotMap {
	m := &slotMap{byAddr: map[string]*clusterNode{}, at: time.Now()}
	for _, r := range ranges {
		n := m.byAddr[r.addr]
		if n == nil {
			if n = old.byAddr[r.addr]; n == nil {
				n = newClusterNode(r.addr, every)
			}
			m.byAddr[r.addr] = n
		}
		for s := max(r.first, 0); s <= r.last && s < slotCount; s++ {
			m.slots[s] = n
		}
	}
	for _, n := range m.byAddr {
		m.owners = append(m.owners, n)
	}
	slices.SortFunc(m.owners, func(a, b *clusterNode) int { return strings.Compare(a.addr, b.addr) })
	for s := range m.slots {
		if old.slots[s] != m.slots[s] {
			m.prev[s] = old.slots[s]
		}
	}
	return m
}
