package integration_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// statCount is the count INFO field prefix (such as "errorstat_NOSCRIPT:count=" or
// "cmdstat_eval:calls=") of section gives on n; 0 when absent.
func statCount(t *testing.T, n *redistest.Server, section, prefix string) int64 {
	t.Helper()
	info := redisString(t, n, "INFO", section)
	_, rest, ok := strings.Cut(info, "\n"+prefix)
	if !ok {
		return 0
	}
	end := strings.IndexAny(rest, ",\r\n")
	v, err := strconv.ParseInt(rest[:end], 10, 64)
	if err != nil {
		t.Fatalf("INFO %s: %s%s: %v", section, prefix, rest[:end], err)
	}
	return v
}

// On a Redis Cluster the sidecar loads the scripts into the replicas too,
// so that a replica promoted by a failover already holds them when the
// takes of its slots reach it: it never answers NOSCRIPT, and no take
// carries a script's text to it.
func TestClusterPromotedReplicaHoldsTheScripts(t *testing.T) {
	c := redistest.StartCluster(t, 3, redistest.WithoutFullCoverage())
	p := launchSidecar(t, socketPath(t), c.URL(), "--redis-timeout", "1s")
	p.waitReady(t)
	for _, r := range c.Replicas {
		eventually(t, "replica "+r.Addr()+" to hold every script", func() bool { return r.HoldsScripts(t, luascript.Sources()...) })
	}
	var subjects []string
	for i := 0; len(subjects) < 20; i++ {
		s := fmt.Sprintf("promo-%d", i)
		if c.InitialMaster(keySlot(inlineKey(p.prefix, s))) == 1 {
			subjects = append(subjects, s)
		}
	}
	conn := p.dial(t)
	take := func(s, id string) reply {
		return conn.do(fmt.Sprintf(`{"op":"take","subject":%q,"limit":100,"window_ms":3600000,"request_id":%q}`, s, id))
	}
	for _, s := range subjects {
		if r := take(s, "before"); !r.ok() {
			t.Fatalf("take before the failover: %s", r)
		}
	}
	promoted := c.Replicas[1]
	c.KillMaster(t, 1)
	c.WaitPromoted(t, 1)
	// Every take of the dead master's slots, retried with its request_id
	// while the sidecar learns the new owner, until it is decided.
	for _, s := range subjects {
		eventually(t, "a take on "+s+" after the failover", func() bool {
			r := take(s, "after")
			if !r.ok() && r.code() != "UNAVAILABLE" {
				t.Fatalf("take after the failover: %s", r)
			}
			return r.ok()
		})
	}
	if n := statCount(t, promoted, "errorstats", "errorstat_NOSCRIPT:count="); n != 0 {
		t.Fatalf("the promoted replica answered NOSCRIPT %d times", n)
	}
	if n := statCount(t, promoted, "commandstats", "cmdstat_eval:calls="); n != 0 {
		t.Fatalf("the promoted replica got %d EVALs carrying a script's text", n)
	}
	if n := statCount(t, promoted, "commandstats", "cmdstat_evalsha:calls="); n == 0 {
		t.Fatal("no take reached the promoted replica: the test proved nothing")
	}
}
