package integration_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"quotad/integration/redistest"
)

// answerSlack is what a round trip through the sidecar's socket may add to
// its Redis timeout on a loaded machine: the time between the client's
// clock readings that the sidecar does not control.
const answerSlack = 250 * time.Millisecond

// recoveryTarget is how soon after a replica's promotion takes on its slots
// must succeed again.
const recoveryTarget = 2 * time.Second

// TestClusterFailoverStopsOnlyTheDeadMastersSlots kills a master of a 3+3
// Cluster (cluster-require-full-coverage off) under load on every master,
// once with --redis-url naming the masters (the dead one among them) and
// once naming only the replicas; then it freezes one instead (SIGSTOP: a
// hung host). Takes on the live masters' slots never fail when the master
// dies (a hung one holds up the batches they share); takes on the dead
// master's slots answer UNAVAILABLE within the Redis timeout until its
// replica is promoted, and succeed again within recoveryTarget of the
// promotion;
// ping's redis_ok is false, naming the node, while the master is down, and
// true for good once the promoted replica serves; so are the metrics. No
// take is over-admitted and every key has a TTL.
func TestClusterFailoverStopsOnlyTheDeadMastersSlots(t *testing.T) {
	for _, v := range []failoverVariant{
		{name: "url names the masters", timeout: 2 * time.Second},
		{name: "url names the replicas", replicaSeeds: true, timeout: 2 * time.Second},
		// A hung master is found down by the first call that times out:
		// a deadline well below the election's, so that the test sees it.
		{name: "master hangs", freeze: true, timeout: 500 * time.Millisecond},
	} {
		t.Run(v.name, func(t *testing.T) { testClusterFailover(t, v) })
	}
}

// failoverVariant is how a failover test fails a master and starts the
// sidecar: --redis-url naming the replicas instead of the masters, the
// master frozen (SIGSTOP) instead of killed, and --redis-timeout.
type failoverVariant struct {
	name                 string
	replicaSeeds, freeze bool
	timeout              time.Duration
}

// attempt is one take's round trip: when it was sent and answered, on
// which side of the failover its subject is, and its error code ("" for a
// definite answer).
type attempt struct {
	sent, answered time.Time
	dead           bool
	code, raw      string
}

// pingSample is one ping's view of Redis.
type pingSample struct {
	at         time.Time
	ok         bool
	redisError string
}

func testClusterFailover(t *testing.T, v failoverVariant) {
	c := redistest.StartCluster(t, 3, redistest.WithoutFullCoverage())
	url := c.URL()
	if v.replicaSeeds {
		url = c.ReplicaURL()
	}
	httpAddr := freeAddr(t)
	p := launchSidecar(t, socketPath(t), url, "--redis-timeout", v.timeout.String(), "--http-addr", httpAddr)
	p.waitReady(t)
	deadMaster := c.Masters[1]

	var dead, live []string
	for i := 0; len(dead) < 30 || len(live) < 60; i++ {
		s := fmt.Sprintf("fo-%d", i)
		if c.InitialMaster(keySlot(inlineKey(p.prefix, s))) == 1 {
			dead = append(dead, s)
		} else {
			live = append(live, s)
		}
	}

	l := newLoad(p)
	var mu sync.Mutex
	var attempts []attempt
	worker := func(name string, subjects []string, isDead bool) {
		conn, err := dialLines(p.socket)
		if err != nil {
			t.Fatal(err)
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer conn.nc.Close()
			var mine []attempt
			defer func() {
				mu.Lock()
				attempts = append(attempts, mine...)
				mu.Unlock()
			}()
			for n := 0; ; n++ {
				select {
				case <-l.stop:
					return
				default:
				}
				subject := subjects[rand.IntN(len(subjects))]
				id := fmt.Sprintf("%s-%d", name, n)
				line := fmt.Sprintf(`{"op":"take","subject":%q,"limit":%d,"window_ms":%d,"request_id":%q}`, subject, l.limit, l.windowMS, id)
				// An UNAVAILABLE take is retried with its request_id until
				// it is decided, as a careful client does.
				for {
					a := attempt{sent: time.Now(), dead: isDead}
					r, err := conn.roundTrip(line)
					a.answered = time.Now()
					if err != nil {
						l.fail("take %s on %s: %v", id, subject, err)
						return
					}
					if !r.ok() {
						a.code, a.raw = r.code(), r.raw
					}
					mine = append(mine, a)
					if r.ok() || r.code() != "UNAVAILABLE" {
						l.record(subject, id, r)
						break
					}
					l.unavailable.Add(1)
					select {
					case <-l.stop:
						l.fail("take %s on %s: still UNAVAILABLE when the load stopped: %s", id, subject, r)
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			}
		}()
	}
	for w := range 2 {
		worker(fmt.Sprintf("dead%d", w), dead, true)
	}
	for w := range 4 {
		worker(fmt.Sprintf("live%d", w), live, false)
	}

	// ping's view, every 20ms, from before the kill to the end.
	var samples []pingSample
	var pingMu sync.Mutex
	stopPing := make(chan struct{})
	pingDone := make(chan struct{})
	pc := p.dial(t)
	go func() {
		defer close(pingDone)
		for {
			select {
			case <-stopPing:
				return
			case <-time.After(20 * time.Millisecond):
			}
			r, err := pc.roundTrip(`{"op":"ping"}`)
			if err != nil {
				l.fail("ping: %v", err)
				return
			}
			ok, _ := r.fields["redis_ok"].(bool)
			e, _ := r.fields["redis_error"].(string)
			pingMu.Lock()
			samples = append(samples, pingSample{at: time.Now(), ok: ok, redisError: e})
			pingMu.Unlock()
		}
	}()

	l.waitDefinite(t, 300, "before the failover")
	if v.freeze {
		c.FreezeMaster(t, 1)
	} else {
		c.KillMaster(t, 1)
	}
	killed := time.Now()
	// The metrics tell which node is down; the election takes longer than
	// the first failed call on the dead master.
	metrics := func() string {
		_, body := httpGet(t, "http://"+httpAddr+"/metrics")
		return body
	}
	deadSeries := fmt.Sprintf("quotad_redis_node_up{addr=%q} ", deadMaster.Addr())
	eventually(t, "the metrics to show the dead master down", func() bool {
		m := metrics()
		return strings.Contains(m, "\n"+deadSeries+"0\n") && strings.Contains(m, "\nquotad_redis_up 0\n")
	})
	promoted := c.WatchPromotion(t, 1)
	if !v.freeze {
		c.WaitHealthy(t)
	}

	// Load goes on until takes on the dead master's slots have succeeded
	// again, and then as many more decisions as before the failover, so
	// that flapping would show.
	eventually(t, "a decision on the promoted master's slots", func() bool {
		r := p.dial(t).call(peekReq(dead[0], loadLimit, loadWindowMS))
		return r.ok()
	})
	// Then three probe intervals more of load and pings, long enough for
	// a breaker that reopens to show.
	recoveredPings := func() int {
		pingMu.Lock()
		defer pingMu.Unlock()
		n := 0
		for _, s := range samples {
			if s.at.After(promoted) && s.ok {
				n++
			}
		}
		return n
	}
	eventually(t, "three seconds of pings after the promotion", func() bool { return recoveredPings() >= 150 })
	l.waitDefinite(t, 300, "after the failover")
	l.finish(t)
	close(stopPing)
	<-pingDone

	recovered := firstDefinite(attempts, killed)
	if recovered.IsZero() {
		t.Fatal("no take on the dead master's slots succeeded after the failover")
	}
	var liveFails, deadFails, lateFails int
	var slowest time.Duration
	var firstDeadFail, lastDeadFail time.Time
	for _, a := range attempts {
		slowest = max(slowest, a.answered.Sub(a.sent))
		if a.code == "" {
			continue
		}
		if !a.dead {
			liveFails++
			// A hung master holds up the batches it shares with other
			// masters' takes (the one-at-a-time clients' group batches)
			// until they time out: when it hangs, and after the promotion
			// until rueidis routes its slots to the promoted replica. Such
			// failures are counted, not refused.
			if v.freeze {
				continue
			}
			if liveFails <= 3 {
				t.Errorf("take on a live master's slot failed at kill%+v: %s", a.answered.Sub(killed).Round(time.Millisecond), a.raw)
			}
			continue
		}
		deadFails++
		if firstDeadFail.IsZero() || a.answered.Before(firstDeadFail) {
			firstDeadFail = a.answered
		}
		if a.answered.After(lastDeadFail) {
			lastDeadFail = a.answered
		}
		if a.sent.After(recovered) {
			lateFails++
			if lateFails <= 3 {
				t.Errorf("take on the promoted master's slots failed %v after they had recovered: %s", a.answered.Sub(recovered).Round(time.Millisecond), a.raw)
			}
		}
	}
	t.Logf("failover: promotion %v after the kill; first success on the dead master's slots %v after the promotion; %d failed attempts on its slots (first %v, last %v after the kill), %d on the live masters' slots; slowest answer %v",
		promoted.Sub(killed).Round(time.Millisecond), recovered.Sub(promoted).Round(time.Millisecond), deadFails,
		firstDeadFail.Sub(killed).Round(time.Millisecond), lastDeadFail.Sub(killed).Round(time.Millisecond), liveFails, slowest.Round(time.Millisecond))
	if got := recovered.Sub(promoted); got > recoveryTarget {
		t.Errorf("takes on the dead master's slots succeeded again %v after the promotion, want within %v", got, recoveryTarget)
	}
	if slowest > v.timeout+answerSlack {
		t.Errorf("the slowest take took %v, want within the Redis timeout %v", slowest, v.timeout)
	}
	if deadFails == 0 {
		t.Error("no take on the dead master's slots failed: the load missed the outage")
	}
	if !slices.ContainsFunc(attempts, func(a attempt) bool {
		return strings.Contains(a.raw, "redis node "+deadMaster.Addr()+" is down (breaker open)")
	}) {
		t.Errorf("no take on the dead master's slots was refused by its breaker, naming %s", deadMaster.Addr())
	}

	// ping: down, naming the dead node, while it was; then up for good.
	var downNamed bool
	var upAgain time.Time
	for _, s := range samples {
		if !s.ok && s.at.After(killed) && s.at.Before(promoted) && strings.Contains(s.redisError, deadMaster.Addr()) {
			downNamed = true
		}
		if s.at.After(promoted) && s.ok && upAgain.IsZero() {
			upAgain = s.at
		}
		if !upAgain.IsZero() && !s.ok {
			t.Errorf("ping reported redis_ok false %v after it was true again (%s)", s.at.Sub(upAgain).Round(time.Millisecond), s.redisError)
			break
		}
	}
	if !downNamed {
		t.Errorf("no ping between the kill and the promotion reported redis_ok false naming %s", deadMaster.Addr())
	}
	if upAgain.IsZero() {
		t.Fatal("ping never reported redis_ok true after the promotion")
	}
	t.Logf("ping: redis_ok true again %v after the promotion", upAgain.Sub(promoted).Round(time.Millisecond))
	m := metrics()
	promotedSeries := fmt.Sprintf("quotad_redis_node_up{addr=%q} 1", c.Replicas[1].Addr())
	if !strings.Contains(m, "\nquotad_redis_up 1\n") || !strings.Contains(m, promotedSeries) || strings.Contains(m, deadSeries) {
		t.Errorf("/metrics after the failover: want quotad_redis_up 1, %s and no series of the dead master; got\n%s", promotedSeries, grepLines(m, "quotad_redis_"))
	}

	for _, n := range []*redistest.Server{c.Masters[0], c.Masters[2], c.Replicas[1]} {
		redistest.AssertAllKeysHaveTTL(t, n.Client(t), p.prefix)
	}
}

// firstDefinite is when the first take on the dead master's slots sent
// after since was answered with a decision, or zero.
func firstDefinite(attempts []attempt, since time.Time) time.Time {
	var first time.Time
	for _, a := range attempts {
		if a.dead && a.code == "" && a.sent.After(since) && (first.IsZero() || a.answered.Before(first)) {
			first = a.answered
		}
	}
	return first
}

// grepLines is the lines of text that start with prefix.
func grepLines(text, prefix string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
