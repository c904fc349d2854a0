package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// SentinelMasterName is the name the sentinels monitor the master under.
const SentinelMasterName = "quotad-test"

// Sentinel is a master, its replica and three sentinels monitoring them,
// every process a Server owned by the test.
type Sentinel struct {
	// Master and Replica are the data nodes as started; after a failover
	// their roles are swapped (MasterAddr says which is which).
	Master, Replica *Server
	Sentinels       []*Server
}

// StartSentinel starts the topology and returns once every sentinel knows
// the replica and the other sentinels, so that a failover can be asked for
// at once. opts apply to the data nodes only.
func StartSentinel(t testing.TB, opts ...Option) *Sentinel {
	t.Helper()
	// A replica's first sync starts at once, not after 5s.
	opts = append([]Option{WithArgs("--repl-diskless-sync-delay", "0")}, opts...)
	s := &Sentinel{Master: Start(t, opts...)}
	s.Replica = Start(t, append(opts, WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(s.Master.port)))...)
	waitTopology(t, "the replica to sync", func() error {
		if st := infoField(t, s.Replica, "replication", "master_link_status"); st != "up" {
			return fmt.Errorf("master link %q", st)
		}
		return nil
	})
	for range 3 {
		// A sentinel rewrites its config file as it learns the topology:
		// each needs its own, writable.
		conf := filepath.Join(t.TempDir(), "sentinel.conf")
		body := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
			"sentinel down-after-milliseconds %[1]s 1000\n"+
			"sentinel failover-timeout %[1]s 5000\n", SentinelMasterName, s.Master.port)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatalf("write sentinel config: %v", err)
		}
		s.Sentinels = append(s.Sentinels, Start(t, func(c *config) { c.conf, c.sentinel = conf, true }))
	}
	waitTopology(t, "the sentinels to know the replica and each other", func() error {
		for _, sn := range s.Sentinels {
			reps, err := sn.Do(t, "SENTINEL", "REPLICAS", SentinelMasterName).ToArray()
			if err != nil {
				return err
			}
			if len(reps) != 1 {
				return fmt.Errorf("%s knows %d replicas", sn.Addr(), len(reps))
			}
			rep, err := reps[0].AsStrMap()
			if err != nil {
				return err
			}
			if rep["flags"] != "slave" || rep["master-link-status"] != "ok" {
				return fmt.Errorf("%s sees the replica as %s, link %s", sn.Addr(), rep["flags"], rep["master-link-status"])
			}
			others, err := sn.Do(t, "SENTINEL", "SENTINELS", SentinelMasterName).ToArray()
			if err != nil {
				return err
			}
			if len(others) != len(s.Sentinels)-1 {
				return fmt.Errorf("%s knows %d other sentinels", sn.Addr(), len(others))
			}
		}
		return nil
	})
	return s
}

// URL names the three sentinels and the master set.
func (s *Sentinel) URL() string {
	return "redis://" + s.Sentinels[0].Addr() + "?addr=" + s.Sentinels[1].Addr() + "&addr=" + s.Sentinels[2].Addr() + "&master_set=" + SentinelMasterName
}

// MasterAddr is the master's address as the first sentinel reports it.
func (s *Sentinel) MasterAddr(t testing.TB) string {
	t.Helper()
	a, err := s.Sentinels[0].Do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMasterName).AsStrSlice()
	if err != nil || len(a) != 2 {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v %v", a, err)
	}
	return a[0] + ":" + a[1]
}

// Failover pauses writes on the master, waits until the replica holds every
// write, asks the first sentinel to fail over, and waits until every
// sentinel names the replica as master and the replica acts as one.
//
// Replication is asynchronous: writes the old master takes after the
// replica's promotion, before clients switch, are lost, which quotad
// documents and no test can assert against. The old master therefore stays
// paused for writes until the test ends (the sentinels turn it into a
// replica meanwhile), so that a test can check every answer exactly:
// requests stuck on it time out and were never applied.
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	old, next := s.Master, s.Replica
	if s.MasterAddr(t) == s.Replica.Addr() {
		old, next = next, old
	}
	mustOK(t, old, "CLIENT", "PAUSE", strconv.Itoa(int(topologyTimeout/time.Millisecond)), "WRITE")
	waitTopology(t, "the replica to catch up with the paused master", func() error {
		mo := infoField(t, old, "replication", "master_repl_offset")
		ro := infoField(t, next, "replication", "slave_repl_offset")
		if mo == "" || mo != ro {
			return fmt.Errorf("master offset %s, replica offset %s", mo, ro)
		}
		return nil
	})
	mustOK(t, s.Sentinels[0], "SENTINEL", "FAILOVER", SentinelMasterName)
	waitTopology(t, "the failover to complete", func() error {
		for _, sn := range s.Sentinels {
			a, err := sn.Do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMasterName).AsStrSlice()
			if err != nil || len(a) != 2 {
				return fmt.Errorf("%s: %v %v", sn.Addr(), a, err)
			}
			if got := a[0] + ":" + a[1]; got != next.Addr() {
				return fmt.Errorf("%s names %s as master", sn.Addr(), got)
			}
		}
		if role := infoField(t, next, "replication", "role"); role != "master" {
			return fmt.Errorf("new master %s is %s", next.Addr(), role)
		}
		return nil
	})
}
