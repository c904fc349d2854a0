package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"quotad/integration/redistest"
	"quotad/keyslot"
)

// testClusterHealth is a clusterHealth over two masters, a:1 serving slots
// 0-8191 and b:1 the rest, both up, and two keys, one on each.
func testClusterHealth(t *testing.T) (ch *clusterHealth, onA, onB string) {
	t.Helper()
	ch = newClusterHealth(zap.NewNop(), time.Second, time.Second, time.Second)
	m := buildSlotMap([]slotRange{{0, 8191, "127.0.0.1:1"}, {8192, 16383, "127.0.0.1:2"}}, ch.slots.Load(), time.Second)
	ch.slots.Store(m)
	for _, n := range m.owners {
		ch.probed(n, nil)
	}
	for i := 0; onA == "" || onB == ""; i++ {
		k := fmt.Sprintf("qt:fw:{i:s%d}", i)
		if keyslot.Of(k) < 8192 {
			onA = k
		} else {
			onB = k
		}
	}
	if !ch.allUp() || !ch.anyUp() {
		t.Fatal("two masters probed up, yet the cluster is not up")
	}
	return ch, onA, onB
}

// A failure counts against the node that failed: the slot's owner, or the
// address a refused connection names when the client routed elsewhere.
func TestClusterFailureStopsOnlyItsNode(t *testing.T) {
	ch, onA, onB := testClusterHealth(t)
	refusedB := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2}, Err: errors.New("connection refused")}

	// A call on a's slot that rueidis sent to b (an older slot map).
	ch.observe(onA, time.Time{}, false, refusedB)
	if err := ch.admit(onA); err != nil {
		t.Errorf("admit(a's key) = %v after b refused a connection, want nil", err)
	}
	err := ch.admit(onB)
	if !errors.Is(err, ErrBreakerOpen) || !strings.Contains(err.Error(), "127.0.0.1:2") {
		t.Errorf("admit(b's key) = %v, want a breaker-open error naming 127.0.0.1:2", err)
	}
	if ch.allUp() || !ch.anyUp() {
		t.Errorf("one of two masters down: allUp %v anyUp %v, want false and true", ch.allUp(), ch.anyUp())
	}
	if e := ch.lastError(); e == nil || !strings.Contains(e.Error(), "127.0.0.1:2") || !strings.Contains(e.Error(), "connection refused") {
		t.Errorf("lastError = %v, want b's address and why", e)
	}

	// A timeout names no node: it counts against the slot's owner.
	ch.observe(onA, time.Time{}, false, context.DeadlineExceeded)
	if !errors.Is(ch.admit(onA), ErrBreakerOpen) || ch.anyUp() {
		t.Errorf("after a timeout on a's key: admit %v, anyUp %v; want breaker open, false", ch.admit(onA), ch.anyUp())
	}

	// A late answer does not close a breaker; a probe does.
	ch.observe(onA, time.Time{}, true, nil)
	if ch.admit(onA) == nil {
		t.Error("a late answer closed a's breaker")
	}
	ch.probed(ch.slots.Load().byAddr["127.0.0.1:1"], nil)
	if ch.admit(onA) != nil || !ch.anyUp() || ch.allUp() {
		t.Errorf("after a's probe: admit %v anyUp %v allUp %v, want nil, true, false", ch.admit(onA), ch.anyUp(), ch.allUp())
	}
}

// A new slot map keeps the breakers of the owners it still has; a new
// owner starts unknown, which Admit lets through.
func TestClusterSlotMapKeepsKnownOwners(t *testing.T) {
	ch, onA, onB := testClusterHealth(t)
	ch.observe(onA, time.Time{}, false, context.DeadlineExceeded)
	ch.observe(onB, time.Time{}, false, context.DeadlineExceeded)
	old := ch.slots.Load()
	// b:1 died and 127.0.0.1:3 took over its slots.
	m := buildSlotMap([]slotRange{{0, 8191, "127.0.0.1:1"}, {8192, 16383, "127.0.0.1:3"}}, old, time.Second)
	ch.slots.Store(m)
	ch.summarize()
	if m.byAddr["127.0.0.1:1"] != old.byAddr["127.0.0.1:1"] {
		t.Error("the new map lost a's breaker")
	}
	if ch.admit(onA) == nil {
		t.Error("a's breaker closed with the new map")
	}
	if err := ch.admit(onB); err != nil {
		t.Errorf("admit on the new owner's slot = %v, want nil", err)
	}
	if ch.anyUp() {
		t.Error("anyUp with one owner down and one not probed yet")
	}

	// Soon after the change, a timeout on b's old slots may come from a
	// call rueidis still sent to b, which is down: it does not stop the
	// new owner.
	ch.observe(onB, time.Time{}, false, context.DeadlineExceeded)
	if err := ch.admit(onB); err != nil {
		t.Errorf("admit on the new owner's slot = %v after a timeout right after the change, want nil", err)
	}
	// Later, it is the new owner's.
	later := *m
	later.at = time.Now().Add(-ch.staleFor)
	ch.slots.Store(&later)
	ch.observe(onB, time.Time{}, false, context.DeadlineExceeded)
	if err := ch.admit(onB); !errors.Is(err, ErrBreakerOpen) || !strings.Contains(err.Error(), "127.0.0.1:3") {
		t.Errorf("admit on the new owner's slot = %v after a later timeout, want its breaker open", err)
	}
}

// A standalone store's Admit is its one breaker.
func TestStandaloneCheckIsTheBreaker(t *testing.T) {
	st := &Store{kind: StoreRedis, log: zap.NewNop()}
	st.damper.every = time.Second
	st.setUp(true, true, nil)
	if err := st.Admit("any"); err != nil {
		t.Fatalf("Admit with Redis up = %v", err)
	}
	st.Observe("other", time.Time{}, HealthDown, errors.New("connection reset"))
	if err := st.Admit("any"); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("Admit with the breaker open = %v, want ErrBreakerOpen", err)
	}
}

// keySlot agrees with Redis's CLUSTER KEYSLOT, hash tags included.
func TestKeyslotIsRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 1)
	n := c.Masters[0]
	for _, k := range []string{"", "a", "123456789", "qt:fw:{i:alice}", "{}x", "x{}{y}", "{a}{b}", "a{b", "a}b{c}", "\xff\x00{\xfe}"} {
		want, err := n.Do(t, "CLUSTER", "KEYSLOT", k).AsInt64()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := keyslot.Of(k); int64(got) != want {
			t.Errorf("keyslot.Of(%q) = %d, redis says %d", k, got, want)
		}
	}
}

// On a real Cluster a dead master stops its own slots and no others, and
// they work again once its replica is promoted.
func TestClusterStoreFailover(t *testing.T) {
	c := redistest.StartCluster(t, 3, redistest.WithoutFullCoverage())
	// Registered first, so it runs once the store is closed.
	t.Cleanup(func() { waitGone(t, closeRemovedConns) })
	st := openStore(t, c.URL())
	waitFor(t, "every master up", st.Up)
	var onDead, onLive string
	for i := 0; onDead == "" || onLive == ""; i++ {
		k := fmt.Sprintf("qt:{s%d}", i)
		switch c.Owner(t, int(keyslot.Of(k))) {
		case c.Masters[1]:
			onDead = k
		case c.Masters[0]:
			onLive = k
		}
	}
	dead := c.Masters[1].Addr()
	c.KillMaster(t, 1)
	waitFor(t, "the dead master's breaker to open", func() bool { return st.Admit(onDead) != nil })
	if err := st.Admit(onDead); !errors.Is(err, ErrBreakerOpen) || !strings.Contains(err.Error(), dead) {
		t.Errorf("Admit on the dead master's key = %v, want breaker open naming %s", err, dead)
	}
	if err := st.Admit(onLive); err != nil {
		t.Errorf("Admit on a live master's key = %v, want nil", err)
	}
	client, err := st.Client()
	if err != nil {
		t.Fatalf("Client with two masters up = %v", err)
	}
	if st.Up() {
		t.Error("Up with a master down")
	}
	if e := st.LastError(); e == nil || !strings.Contains(e.Error(), dead) {
		t.Errorf("LastError = %v, want it to name %s", e, dead)
	}
	if got, want := st.Nodes(), nodesWith(c.Masters, dead); !slices.Equal(got, want) {
		t.Errorf("Nodes() = %v, want %v", got, want)
	}
	ctx := context.Background()
	if err := client.Do(ctx, client.B().Set().Key(onLive).Value("1").Build()).Error(); err != nil {
		t.Errorf("SET on a live master: %v", err)
	}
	c.WaitPromoted(t, 1)
	waitFor(t, "the promoted replica to serve", func() bool {
		if st.Admit(onDead) != nil || !st.Up() {
			return false
		}
		err := client.Do(ctx, client.B().Set().Key(onDead).Value("1").Build()).Error()
		h := HealthDown
		if err == nil || isRedisReply(err) {
			h = HealthUp
		}
		st.Observe(onDead, time.Time{}, h, err)
		return err == nil
	})
	if st.LastError() != nil {
		t.Errorf("LastError = %v once every slot is served", st.LastError())
	}
	owners := []*redistest.Server{c.Masters[0], c.Replicas[1], c.Masters[2]}
	if got, want := st.Nodes(), nodesWith(owners, ""); !slices.Equal(got, want) {
		t.Errorf("Nodes() = %v, want %v", got, want)
	}
}

// nodesWith is what Store.Nodes reports for owners, all up but down.
func nodesWith(owners []*redistest.Server, down string) []NodeHealth {
	var out []NodeHealth
	for _, o := range owners {
		out = append(out, NodeHealth{Addr: o.Addr(), Up: o.Addr() != down})
	}
	slices.SortFunc(out, func(a, b NodeHealth) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// closeRemovedConns is the goroutine a rueidis slot map refresh leaves to
// close, five seconds later, the connections of nodes that left the map
// (the dead master). Client.Close does not stop it: it is slow to exit, not
// leaked.
const closeRemovedConns = "github.com/redis/rueidis.(*clusterClient)._refresh.func2"

// waitGone waits until no goroutine runs fn, failing the test after
// waitTimeout.
func waitGone(t testing.TB, fn string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for strings.Contains(redistest.AllStacks(), fn) {
		if time.Now().After(deadline) {
			t.Errorf("%s still running %v after the store closed", fn, waitTimeout)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
