package integration_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// TestClusterFailoverAndMigrationUnderLoad runs a sidecar against a Redis
// Cluster of three masters with a replica each, with takes on subjects spread
// over every master. A slot moves between masters (MIGRATING/IMPORTING,
// MIGRATE, SETSLOT NODE) and decisions on it follow ASK and MOVED without an
// error; then a master is killed and its replica promoted: answers in the
// gap are UNAVAILABLE, never a wrong allow or deny, and the sidecar recovers
// by itself.
func TestClusterFailoverAndMigrationUnderLoad(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	// As the documented ACL user (docs/redis.md): a Cluster needs nothing more.
	addACLUser(t, append(c.Masters, c.Replicas...)...)
	// A long deadline, so that only a redirection not followed, never a
	// slow machine, can make a take UNAVAILABLE during the migration. A
	// dead master refuses connections at once: the failover does not wait
	// on it.
	p := launchSidecarEnv(t, socketPath(t), strings.Replace(c.URL(), "redis://", "redis://quotad@", 1), []string{"QUOTAD_REDIS_PASSWORD=" + aclPassword}, "--redis-timeout", "5s")
	p.waitReady(t)

	subjects := make([]string, 300)
	perMaster := map[*redistest.Server]int{}
	for i := range subjects {
		subjects[i] = fmt.Sprintf("user-%d", i)
		perMaster[c.Owner(t, keySlot(inlineKey(p.prefix, subjects[i])))]++
	}
	for _, m := range c.Masters {
		if perMaster[m] == 0 {
			t.Fatalf("no subject on master %s: the load would not cover every master", m.Addr())
		}
	}
	// Subjects sharing one slot of Masters[0], the slot to migrate.
	slot := keySlot(inlineKey(p.prefix, "mig-0"))
	for c.Owner(t, slot) != c.Masters[0] {
		slot = keySlot(inlineKey(p.prefix, fmt.Sprintf("mig-%d", slot)))
	}
	var migSubjects []string
	for n := 0; len(migSubjects) < 8; n++ {
		s := "mig-" + strconv.Itoa(n)
		if keySlot(inlineKey(p.prefix, s)) == slot {
			migSubjects = append(migSubjects, s)
		}
	}

	l := newLoad(p)
	for w := range 4 {
		l.run(t, fmt.Sprintf("w%d", w), subjects)
	}
	l.run(t, "mig", migSubjects)
	l.waitDefinite(t, 500, "before any change")

	// Slot migration: every answer on the migrating slot must be definite.
	unavailableBefore := l.unavailable.Load()
	m := c.BeginMigration(t, slot, 2)
	l.waitDefinite(t, 200, "while the slot is MIGRATING")
	moved := m.MoveKeys(t)
	l.waitDefinite(t, 200, "after its keys moved")
	m.Finish(t)
	l.waitDefinite(t, 200, "after the slot changed owner")
	if n := l.unavailable.Load() - unavailableBefore; n != 0 {
		t.Errorf("%d UNAVAILABLE answers during a slot migration; redirections should be followed", n)
	}
	if moved == 0 {
		t.Error("the migration moved no key: the slot's subjects were not under load")
	}
	asking := c.Masters[2].InfoField(t, "commandstats", "cmdstat_asking")
	if !strings.HasPrefix(asking, "calls=") || strings.HasPrefix(asking, "calls=0,") {
		t.Errorf("the importing master got no ASKING (%q): no request followed an ASK redirection", asking)
	}
	if n := redisInt(t, c.Masters[2], "EXISTS", inlineKey(p.prefix, migSubjects[0])); n != 1 {
		t.Errorf("the key of %s is not on its new master", migSubjects[0])
	}

	// Failover: a master dies under load and its replica takes over.
	c.KillMaster(t, 1)
	before := l.unavailable.Load()
	eventually(t, "an UNAVAILABLE answer while the master is gone", func() bool { return l.unavailable.Load() > before })
	c.WaitPromoted(t, 1)
	l.waitDefinite(t, 500, "after the failover")
	// Every master, the promoted one too, decides again.
	for _, s := range subjects {
		if c.Owner(t, keySlot(inlineKey(p.prefix, s))) == c.Replicas[1] {
			eventually(t, "a decision on the promoted master", func() bool {
				r := p.dial(t).call(peekReq(s, loadLimit, loadWindowMS))
				return r.ok()
			})
			break
		}
	}
	l.finish(t)

	for _, n := range []*redistest.Server{c.Masters[0], c.Masters[2], c.Replicas[1]} {
		if got := quotadConns(t, n); got < 1 || got > 4 {
			t.Errorf("master %s has %d quotad connections, want 1 to 4", n.Addr(), got)
		}
		redistest.AssertAllKeysHaveTTL(t, n.Client(t), p.prefix)
	}
	wantNoACLDenials(t, append(c.Masters, c.Replicas...)...)
}
