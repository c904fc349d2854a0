package redistest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// ClusterNodeTimeout is the cluster-node-timeout of every cluster node:
	// short, so that a failover takes a few seconds, not fifteen.
	ClusterNodeTimeout = 1000 * time.Millisecond
	// topologyTimeout bounds a wait for a cluster or Sentinel to settle (to
	// form, fail over, reconfigure). It is far above what that takes on an
	// idle machine; it only decides how long a broken test takes to fail.
	topologyTimeout = 60 * time.Second
	slots           = 16384
)

// Cluster is a Redis Cluster of masters with one replica each, on free
// ports, every node a Server owned by the test.
type Cluster struct {
	// Masters[i] serves the i-th equal share of the slots at start, and
	// Replicas[i] replicates it. A failover does not reorder them.
	Masters  []*Server
	Replicas []*Server
}

// StartCluster starts masters masters and as many replicas, joins them in a
// cluster, and returns once every node sees all slots served and every
// replica is in sync. opts apply to every node.
func StartCluster(t testing.TB, masters int, opts ...Option) *Cluster {
	t.Helper()
	opts = append([]Option{func(c *config) { c.cluster = true }}, opts...)
	c := &Cluster{}
	for range masters {
		c.Masters = append(c.Masters, Start(t, opts...))
	}
	for range masters {
		c.Replicas = append(c.Replicas, Start(t, opts...))
	}
	all := c.nodes()
	for i, m := range c.Masters {
		lo, hi := i*slots/masters, (i+1)*slots/masters-1
		mustOK(t, m, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi))
	}
	for _, n := range all[1:] {
		mustOK(t, n, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(all[0].port), strconv.Itoa(all[0].busPort))
	}
	waitTopology(t, "every cluster node to know every other", func() error {
		for _, n := range all {
			nodes, err := clusterNodes(t, n)
			if err != nil {
				return err
			}
			if len(nodes) != len(all) {
				return fmt.Errorf("%s knows %d nodes", n.Addr(), len(nodes))
			}
			for _, cn := range nodes {
				if strings.Contains(cn.flags, "handshake") || cn.link != "connected" && !strings.Contains(cn.flags, "myself") {
					return fmt.Errorf("%s sees %s as %s, %s", n.Addr(), cn.addr, cn.flags, cn.link)
				}
			}
		}
		return nil
	})
	for i, r := range c.Replicas {
		mustOK(t, r, "CLUSTER", "REPLICATE", nodeID(t, c.Masters[i]))
	}
	c.WaitHealthy(t)
	return c
}

func (s *Server) clusterArgs() []string {
	if !s.cluster {
		return nil
	}
	return []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf", // in the server's own --dir
		"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout / time.Millisecond)),
		"--cluster-port", strconv.Itoa(s.busPort),
		// A replica's first sync starts at once, not after 5s.
		"--repl-diskless-sync-delay", "0",
	}
}

func (c *Cluster) nodes() []*Server {
	return append(append([]*Server(nil), c.Masters...), c.Replicas...)
}

// URL names every master: the client discovers the rest from any of them.
func (c *Cluster) URL() string {
	u := c.Masters[0].URL()
	for i, m := range c.Masters[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + m.Addr()
	}
	return u
}

// InitialMaster is the index in Masters of the master that served slot
// when the cluster started.
func (c *Cluster) InitialMaster(slot int) int {
	n := len(c.Masters)
	i := slot * n / slots
	for i+1 < n && (i+1)*slots/n <= slot {
		i++
	}
	for i > 0 && i*slots/n > slot {
		i--
	}
	return i
}

// ReplicaURL names every replica and no master: a client must learn the
// masters from the replicas' slot map.
func (c *Cluster) ReplicaURL() string {
	u := c.Replicas[0].URL()
	for i, r := range c.Replicas[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + r.Addr()
	}
	return u
}

// WithoutFullCoverage starts cluster nodes with
// cluster-require-full-coverage off: while a master is down the others
// keep serving their slots.
func WithoutFullCoverage() Option {
	return WithArgs("--cluster-require-full-coverage", "no")
}

// WatchPromotion polls Replicas[i] every few milliseconds until it reports
// the master role, and returns when it first did: the moment of its
// promotion, to within the polling step.
func (c *Cluster) WatchPromotion(t testing.TB, i int) time.Time {
	t.Helper()
	r := c.Replicas[i]
	deadline := time.Now().Add(topologyTimeout)
	for {
		if infoField(t, r, "replication", "role") == "master" {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not promoted within %v", r.Addr(), topologyTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitHealthy waits until every running node reports cluster_state:ok and
// agrees that each slot range has a master and, where its replica runs, that
// the replica is in sync.
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	waitTopology(t, "the cluster to be healthy", func() error {
		var running []*Server
		for _, n := range c.nodes() {
			if n.Running() {
				running = append(running, n)
			}
		}
		for _, n := range running {
			info, err := n.Do(t, "CLUSTER", "INFO").ToString()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster state not ok", n.Addr())
			}
			if role := infoField(t, n, "replication", "role"); role == "slave" {
				if st := infoField(t, n, "replication", "master_link_status"); st != "up" {
					return fmt.Errorf("replica %s: master link %s", n.Addr(), st)
				}
			}
		}
		// Every node must see the same masters, so that a client asking
		// any node gets the same map.
		want := ""
		for _, n := range running {
			nodes, err := clusterNodes(t, n)
			if err != nil {
				return err
			}
			var masters []string
			for _, cn := range nodes {
				if strings.Contains(cn.flags, "master") && !strings.Contains(cn.flags, "fail") && len(cn.slots) > 0 {
					masters = append(masters, cn.addr+" "+strings.Join(cn.slots, ","))
				}
			}
			slices.Sort(masters)
			got := strings.Join(masters, ";")
			if len(masters) != len(c.Masters) || want != "" && got != want {
				return fmt.Errorf("%s sees masters %s", n.Addr(), got)
			}
			want = got
		}
		return nil
	})
}

// KillMaster pauses writes on Masters[i], waits until its replica holds
// every write, and kills it with SIGKILL. Replication is asynchronous: a
// master killed with writes its replica has not received loses them, which
// quotad documents and no test can assert against. This one fails a master
// without that loss, so that a test can check every answer exactly.
// Requests reaching the master while it is paused hang until the kill and
// fail; they were never applied.
func (c *Cluster) KillMaster(t testing.TB, i int) {
	t.Helper()
	m, r := c.Masters[i], c.Replicas[i]
	mustOK(t, m, "CLIENT", "PAUSE", strconv.Itoa(int(topologyTimeout/time.Millisecond)), "WRITE")
	waitTopology(t, "the replica to catch up with the paused master", func() error {
		mo := infoField(t, m, "replication", "master_repl_offset")
		ro := infoField(t, r, "replication", "slave_repl_offset")
		if mo == "" || mo != ro {
			return fmt.Errorf("master offset %s, replica offset %s", mo, ro)
		}
		return nil
	})
	m.Kill(t)
}

// FreezeMaster is KillMaster with SIGSTOP instead of SIGKILL: the master's
// connections stay open and nothing on them is answered, as with a host
// gone without a reset. It is killed when the test ends: thawed, a paused
// master that lost its slots would hold up its shutdown. WaitHealthy and
// Owner must not be called while it is frozen: they would wait on it.
func (c *Cluster) FreezeMaster(t testing.TB, i int) {
	t.Helper()
	m, r := c.Masters[i], c.Replicas[i]
	mustOK(t, m, "CLIENT", "PAUSE", strconv.Itoa(int(topologyTimeout/time.Millisecond)), "WRITE")
	waitTopology(t, "the replica to catch up with the paused master", func() error {
		mo := infoField(t, m, "replication", "master_repl_offset")
		ro := infoField(t, r, "replication", "slave_repl_offset")
		if mo == "" || mo != ro {
			return fmt.Errorf("master offset %s, replica offset %s", mo, ro)
		}
		return nil
	})
	m.Freeze(t)
	t.Cleanup(func() { m.Kill(t) })
}

// WaitPromoted waits until Replicas[i] has taken over from its killed
// master and the cluster is healthy again.
func (c *Cluster) WaitPromoted(t testing.TB, i int) {
	t.Helper()
	r := c.Replicas[i]
	waitTopology(t, "the replica to be promoted", func() error {
		if role := infoField(t, r, "replication", "role"); role != "master" {
			return fmt.Errorf("%s is %s", r.Addr(), role)
		}
		return nil
	})
	c.WaitHealthy(t)
}

// Migration moves one slot between masters in the steps of a resharding, so
// that a test can run load between them.
type Migration struct {
	slot     int
	src, dst *Server
	c        *Cluster
}

// BeginMigration marks slot as IMPORTING on Masters[dst] and MIGRATING on
// its current owner: from now on the owner answers ASK for keys it no longer
// has.
func (c *Cluster) BeginMigration(t testing.TB, slot, dst int) *Migration {
	t.Helper()
	src := c.Owner(t, slot)
	d := c.Masters[dst]
	if src == d {
		t.Fatalf("slot %d is already on %s", slot, d.Addr())
	}
	s := strconv.Itoa(slot)
	mustOK(t, d, "CLUSTER", "SETSLOT", s, "IMPORTING", nodeID(t, src))
	mustOK(t, src, "CLUSTER", "SETSLOT", s, "MIGRATING", nodeID(t, d))
	return &Migration{slot: slot, src: src, dst: d, c: c}
}

// MoveKeys migrates the slot's keys one at a time with MIGRATE and returns
// how many it moved.
func (m *Migration) MoveKeys(t testing.TB) int {
	t.Helper()
	moved := 0
	for {
		keys, err := m.src.Do(t, "CLUSTER", "GETKEYSINSLOT", strconv.Itoa(m.slot), "10").AsStrSlice()
		if err != nil {
			t.Fatalf("CLUSTER GETKEYSINSLOT %d: %v", m.slot, err)
		}
		if len(keys) == 0 {
			return moved
		}
		for _, k := range keys {
			err := m.src.Do(t, "MIGRATE", "127.0.0.1", strconv.Itoa(m.dst.port), k, "0", "5000").Error()
			// NOKEY: the key expired or moved since GETKEYSINSLOT.
			if err != nil && !strings.Contains(err.Error(), "NOKEY") {
				t.Fatalf("MIGRATE %s: %v", k, err)
			}
			moved++
		}
	}
}

// Finish assigns the slot to its new owner on every master: clients that
// still send to the old one get MOVED.
func (m *Migration) Finish(t testing.TB) {
	t.Helper()
	id := nodeID(t, m.dst)
	s := strconv.Itoa(m.slot)
	mustOK(t, m.dst, "CLUSTER", "SETSLOT", s, "NODE", id)
	mustOK(t, m.src, "CLUSTER", "SETSLOT", s, "NODE", id)
	for _, n := range m.c.Masters {
		if n != m.src && n != m.dst && n.Running() {
			mustOK(t, n, "CLUSTER", "SETSLOT", s, "NODE", id)
		}
	}
	waitTopology(t, "every node to agree on the slot's new owner", func() error {
		for _, n := range m.c.nodes() {
			if !n.Running() {
				continue
			}
			if o := slotOwnerSeenBy(t, n, m.slot); o != m.dst.Addr() {
				return fmt.Errorf("%s sees slot %d on %s", n.Addr(), m.slot, o)
			}
		}
		return nil
	})
}

// Owner is the node that serves slot, as the first running master sees it.
func (c *Cluster) Owner(t testing.TB, slot int) *Server {
	t.Helper()
	var addr string
	for _, n := range c.nodes() {
		if n.Running() {
			addr = slotOwnerSeenBy(t, n, slot)
			break
		}
	}
	for _, n := range c.nodes() {
		if n.Addr() == addr {
			return n
		}
	}
	t.Fatalf("slot %d is served by %q, not a node of this cluster", slot, addr)
	return nil
}

func slotOwnerSeenBy(t testing.TB, n *Server, slot int) string {
	t.Helper()
	nodes, err := clusterNodes(t, n)
	if err != nil {
		t.Fatalf("CLUSTER NODES on %s: %v", n.Addr(), err)
	}
	for _, cn := range nodes {
		if !strings.Contains(cn.flags, "master") {
			continue
		}
		for _, r := range cn.slots {
			if strings.HasPrefix(r, "[") {
				continue // a migration in progress
			}
			lo, hi, _ := strings.Cut(r, "-")
			if hi == "" {
				hi = lo
			}
			l, _ := strconv.Atoi(lo)
			h, _ := strconv.Atoi(hi)
			if slot >= l && slot <= h {
				return cn.addr
			}
		}
	}
	return ""
}

// Running reports whether the server process is up (not stopped or killed).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// Kill ends the server with SIGKILL, as a crash would: nothing is flushed
// and clients see their connections reset.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.closeShared()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return
	}
	s.proc = nil
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill redis-server: %v", err)
	}
	<-p.done
}

type clusterNode struct {
	id, addr, flags, link string
	slots                 []string
}

func clusterNodes(t testing.TB, n *Server) ([]clusterNode, error) {
	t.Helper()
	out, err := n.Do(t, "CLUSTER", "NODES").ToString()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER NODES on %s: %w", n.Addr(), err)
	}
	var nodes []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		nodes = append(nodes, clusterNode{id: f[0], addr: addr, flags: f[2], link: f[7], slots: f[8:]})
	}
	return nodes, nil
}

func nodeID(t testing.TB, n *Server) string {
	t.Helper()
	id, err := n.Do(t, "CLUSTER", "MYID").ToString()
	if err != nil {
		t.Fatalf("CLUSTER MYID on %s: %v", n.Addr(), err)
	}
	return id
}

// infoField is one field of INFO section, or "" if absent or unreachable.
func infoField(t testing.TB, n *Server, section, field string) string {
	t.Helper()
	info, err := n.Do(t, "INFO", section).ToString()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// InfoField is one field of INFO section of the server, or "" if absent or
// the server does not answer.
func (s *Server) InfoField(t testing.TB, section, field string) string {
	t.Helper()
	return infoField(t, s, section, field)
}

func mustOK(t testing.TB, n *Server, args ...string) {
	t.Helper()
	if err := n.Do(t, args...).Error(); err != nil {
		t.Fatalf("%s on %s: %v", strings.Join(args, " "), n.Addr(), err)
	}
}

// waitTopology polls cond until it returns nil, failing the test with the
// last reason after topologyTimeout.
func waitTopology(t testing.TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(topologyTimeout)
	backoff := 10 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s: %v", topologyTimeout, what, err)
		}
		time.Sleep(backoff)
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}
