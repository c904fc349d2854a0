package integration_test

import (
	"fmt"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// TestSentinelFailoverUnderLoad runs a sidecar against a master, a replica
// and three sentinels, fails over with SENTINEL FAILOVER under load, and
// checks that the sidecar follows the new master by itself with no wrong
// answer.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	s := redistest.StartSentinel(t)
	// As the documented ACL user (docs/redis.md) on the data nodes; the
	// sentinels need no password here.
	addACLUser(t, s.Master, s.Replica)
	p := launchSidecarEnv(t, socketPath(t), strings.Replace(s.URL(), "redis://", "redis://quotad@", 1), []string{"QUOTAD_REDIS_PASSWORD=" + aclPassword})
	p.waitReady(t)
	subjects := make([]string, 100)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("user-%d", i)
	}
	l := newLoad(p)
	for w := range 4 {
		l.run(t, fmt.Sprintf("w%d", w), subjects)
	}
	l.waitDefinite(t, 500, "before the failover")
	if n := quotadConns(t, s.Master); n < 1 || n > 4 {
		t.Errorf("the master has %d quotad connections, want 1 to 4", n)
	}

	s.Failover(t)
	// Decisions go on, and they are the new master's: a subject first
	// taken now exists there.
	l.waitDefinite(t, 500, "after the failover")
	c := p.dial(t)
	wantTake(t, c.call(takeReq("after-failover", 5, loadWindowMS)), true, false, 5, 1)
	if n := redisInt(t, s.Replica, "EXISTS", inlineKey(p.prefix, "after-failover")); n != 1 {
		t.Error("a take after the failover did not reach the new master")
	}
	l.finish(t)
	if n := quotadConns(t, s.Replica); n < 1 || n > 4 {
		t.Errorf("the new master has %d quotad connections, want 1 to 4", n)
	}
	redistest.AssertAllKeysHaveTTL(t, s.Replica.Client(t), p.prefix)
	wantNoACLDenials(t, s.Master, s.Replica)
}
