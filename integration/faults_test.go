package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// TestChaosNoWindowOverAdmitsAndEveryKeyKeepsATTL hammers a few subjects
// with windows of a few milliseconds from many connections while another
// client deletes their keys and cuts their TTLs to a few milliseconds, so
// windows end and reopen under load at every point of the script. Each
// window accepts takes with used 1, 2, ... up to the limit, once each; so
// over any run, the number of accepted takes that saw used v can only fall
// as v grows, and none sees more than the limit. Afterwards no key lacks a
// TTL.
func TestChaosNoWindowOverAdmitsAndEveryKeyKeepsATTL(t *testing.T) {
	t.Parallel()
	const (
		workers  = 12
		takes    = 300 // per worker
		subjects = 4
		limit    = 5
		windowMS = 20
	)
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	rc := r.Client(t)

	ctx, stopChaos := context.WithCancel(context.Background())
	var chaos sync.WaitGroup
	var chaosOps [2]int64 // DELs, PEXPIREs that found a key
	for op := range 2 {
		chaos.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(op), 7))
			for ctx.Err() == nil {
				key := luascript.FixedWindowKey(sc.prefix, "", "chaos-"+strconv.Itoa(rng.IntN(subjects)))
				var cmd = rc.B().Del().Key(key).Build()
				if op == 1 {
					cmd = rc.B().Pexpire().Key(key).Milliseconds(int64(1 + rng.IntN(4))).Build()
				}
				if n, err := rc.Do(ctx, cmd).AsInt64(); err == nil && n == 1 {
					chaosOps[op]++
				}
			}
		})
	}

	type decision struct {
		subject int
		allowed bool
		replay  bool
		used    int64
	}
	results := make([][]decision, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := sc.dial(t)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for n := range takes {
				subj := rng.IntN(subjects)
				req := fmt.Sprintf(`{"op":"take","subject":"chaos-%d","limit":%d,"window_ms":%d`, subj, limit, windowMS)
				if n%3 == 0 {
					req += fmt.Sprintf(`,"request_id":"w%d-%d"`, w, n)
				}
				req += "}"
				// Every third take carries a request_id and is sent twice: the
				// second is a replay, or a new take if its window ended.
				for range 1 + boolInt(n%3 == 0) {
					rep, err := c.roundTrip(req)
					if err != nil {
						errs[w] = err
						return
					}
					if !rep.ok() {
						errs[w] = fmt.Errorf("take %s: got %s, want a decision", req, rep)
						return
					}
					d := decision{subject: subj, allowed: rep.fields["allowed"] == true, replay: rep.fields["replay"] == true}
					u, err := strconv.ParseInt(fmt.Sprint(rep.fields["used"]), 10, 64)
					if err != nil {
						errs[w] = fmt.Errorf("reply %s: used: %w", rep, err)
						return
					}
					d.used = u
					results[w] = append(results[w], d)
				}
			}
		})
	}
	wg.Wait()
	stopChaos()
	chaos.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	// accepted[s][v] counts the takes on subject s accepted with used v.
	var accepted [subjects][limit + 2]int
	var total, denied, replays int
	for _, ds := range results {
		for _, d := range ds {
			total++
			switch {
			case d.used < 0 || d.used > limit:
				t.Fatalf("a take on chaos-%d saw used %d, limit %d", d.subject, d.used, limit)
			case d.replay:
				replays++
				if !d.allowed || d.used < 1 {
					t.Fatalf("a replay on chaos-%d: allowed %v used %d", d.subject, d.allowed, d.used)
				}
			case d.allowed:
				accepted[d.subject][d.used]++
			default:
				denied++
			}
		}
	}
	for s := range subjects {
		if accepted[s][0] != 0 {
			t.Errorf("chaos-%d: %d takes accepted with used 0", s, accepted[s][0])
		}
		for v := 1; v < limit; v++ {
			if accepted[s][v+1] > accepted[s][v] {
				t.Errorf("chaos-%d: %d takes accepted with used %d but only %d with used %d: a window admitted past its count (%v)",
					s, accepted[s][v+1], v+1, accepted[s][v], v, accepted[s][1:limit+1])
			}
		}
	}
	t.Logf("%d takes (%d denied, %d replays); chaos: %d DELs and %d PEXPIREs hit a key; accepted by used value per subject: %v",
		total, denied, replays, chaosOps[0], chaosOps[1], accepted)
	if denied == 0 || chaosOps[0] == 0 || chaosOps[1] == 0 {
		t.Fatalf("the load never reached the limit or the chaos never hit a key (%d denied, %v): the test proved nothing", denied, chaosOps)
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestSidecarKilledUnderLoadRetriesGiveTheOriginalAnswers kills the sidecar
// with SIGKILL while clients pipeline takes, starts a new one on the same
// socket, and retries every request_id: those answered before the kill get
// their original answer back as a replay, those cut off are either replays
// or accepted now, and Redis counts each id once.
func TestSidecarKilledUnderLoadRetriesGiveTheOriginalAnswers(t *testing.T) {
	t.Parallel()
	const (
		workers = 8
		batch   = 16
		limit   = 1_000_000
	)
	r := redistest.Start(t)
	p := startSidecar(t, r.URL())
	take := func(id string) string {
		return fmt.Sprintf(`{"op":"take","subject":"killed","limit":%d,"window_ms":600000,"request_id":%q}`, limit, id)
	}

	var mu sync.Mutex
	answered := map[string]int64{} // request_id -> used in its original answer
	sent := map[string]bool{}
	closedErrs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := p.dial(t)
		wg.Go(func() {
			for n := 0; ; n += batch {
				lines := make([]string, batch)
				var b []byte
				for i := range lines {
					id := fmt.Sprintf("k%d-%d", w, n+i)
					lines[i] = id
					b = append(append(b, take(id)...), '\n')
				}
				mu.Lock()
				for _, id := range lines {
					sent[id] = true
				}
				mu.Unlock()
				if err := c.writeErr(b); err != nil {
					closedErrs[w] = err
					return
				}
				for _, id := range lines {
					rep, err := c.readErr()
					if err != nil {
						closedErrs[w] = err
						return
					}
					if !rep.ok() || rep.fields["allowed"] != true {
						closedErrs[w] = fmt.Errorf("take %s: got %s, want allowed", id, rep)
						return
					}
					used, err := strconv.ParseInt(fmt.Sprint(rep.fields["used"]), 10, 64)
					if err != nil {
						closedErrs[w] = fmt.Errorf("take %s: %s: %w", id, rep, err)
						return
					}
					mu.Lock()
					answered[id] = used
					mu.Unlock()
				}
			}
		})
	}
	eventually(t, "the load to get going", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(answered) >= 500
	})
	p.wantStatus = -1 // killed by a signal
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	p.wait(t)
	for w, err := range closedErrs {
		// A reply that was not a clean decision would be a bug; the kill
		// must show as a closed connection.
		if err == nil || !(strings.Contains(err.Error(), "EOF") || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
			t.Fatalf("worker %d ended with %v, want a closed connection", w, err)
		}
	}

	// The new sidecar takes over the socket file the killed one left, with
	// the same key prefix (the last --key-prefix given wins).
	p2 := launchSidecar(t, p.socket, r.URL(), "--key-prefix", p.prefix)
	p2.prefix = p.prefix
	p2.waitReady(t)
	c := p2.dial(t)
	cutOff := 0
	for id := range sent {
		rep := c.do(take(id))
		if !rep.ok() || rep.fields["allowed"] != true {
			t.Fatalf("retry of %s: got %s, want allowed", id, rep)
		}
		if used, ok := answered[id]; ok {
			if rep.fields["replay"] != true || rep.num(t, "used") != used {
				t.Fatalf("retry of %s: got %s, want a replay with the original used %d", id, rep, used)
			}
			continue
		}
		cutOff++
	}
	// Each id was consumed once, whether the killed sidecar or the new one
	// ran it.
	wantPeek(t, c.call(peekReq("killed", limit, 600000)), limit, int64(len(sent)))
	t.Logf("%d takes answered before SIGKILL, %d cut off and retried", len(answered), cutOff)
	assertKeysHaveTTL(t, r, p.prefix)
}

// procStatus reads a field of /proc/<pid>/status as an integer (kB for
// memory).
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status %s: %v", pid, field, err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

func procFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestHungRedisKeepsTheSidecarBounded freezes Redis (SIGSTOP: connections
// open, nothing answered) under load from many connections: after the first
// timeout the breaker answers every take, and the sidecar's threads, memory
// and file descriptors stay bounded; when Redis answers again the sidecar
// serves without a restart.
func TestHungRedisKeepsTheSidecarBounded(t *testing.T) {
	t.Parallel()
	const conns, perConn = 20, 200
	r := redistest.Start(t)
	p := startSidecar(t, r.URL(), "--redis-timeout", "2s")
	pid := p.cmd.Process.Pid
	c := p.dial(t)
	wantTake(t, c.call(takeReq("hung", 10, 60000)), true, false, 10, 1)
	clients := make([]*lineConn, conns)
	for i := range clients {
		clients[i] = p.dial(t)
		clients[i].ping("ready") // accepted and served
	}
	threads, rss, fds := procStatus(t, pid, "Threads"), procStatus(t, pid, "VmRSS"), procFDs(t, pid)

	r.Freeze(t)
	// The take reaches Redis's socket: its outcome is unknown until Redis
	// runs it, after the thaw.
	frozen := takeReq("hung", 10, 60000, "request_id", "frozen")
	wantError(t, c.call(frozen), "UNAVAILABLE")
	eventually(t, "ping to report redis_ok false", func() bool {
		return !c.do(`{"op":"ping"}`).flag(t, "redis_ok")
	})
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for i, cl := range clients {
		wg.Go(func() {
			var b []byte
			for j := range perConn {
				b = append(append(b, mustJSON(t, takeReq("hung-"+strconv.Itoa(i), 10, 60000, "request_id", "r"+strconv.Itoa(j)))...), '\n')
			}
			if errs[i] = cl.writeErr(b); errs[i] != nil {
				return
			}
			for range perConn {
				rep, err := cl.readErr()
				if err == nil && (rep.code() != "UNAVAILABLE" || !strings.Contains(fmt.Sprint(rep.fields["message"]), "breaker open")) {
					err = fmt.Errorf("take while Redis hangs: got %s, want UNAVAILABLE from the open breaker", rep)
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	threads2, rss2, fds2 := procStatus(t, pid, "Threads"), procStatus(t, pid, "VmRSS"), procFDs(t, pid)
	t.Logf("%d takes answered by the breaker; threads %d -> %d, VmRSS %d -> %d kB, fds %d -> %d",
		conns*perConn, threads, threads2, rss, rss2, fds, fds2)
	if threads2 > threads+16 || rss2 > rss+200_000 || fds2 > fds+8 {
		t.Fatalf("the sidecar grew during the outage: threads %d -> %d, VmRSS %d -> %d kB, fds %d -> %d", threads, threads2, rss, rss2, fds, fds2)
	}

	r.Thaw(t)
	eventually(t, "the retry to succeed once Redis answers", func() bool {
		rep := c.call(frozen)
		if !rep.ok() {
			wantError(t, rep, "UNAVAILABLE")
			return false
		}
		// A replay if Redis ran the frozen take after the thaw, a first
		// acceptance otherwise: consumed once either way.
		if rep.flag(t, "allowed") != true || rep.num(t, "used") != 2 {
			t.Fatalf("retry of the take sent while Redis hung: got %s, want allowed with used 2", rep)
		}
		return true
	})
	wantPeek(t, c.call(peekReq("hung", 10, 60000)), 10, 2)
	assertKeysHaveTTL(t, r, p.prefix)
}

// TestOnUnavailableFromTheConfigFile fails open and closed per policy, as
// configured in the policy file, while Redis is stopped; the degraded
// answers are marked, and real decisions resume when Redis is back.
func TestOnUnavailableFromTheConfigFile(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "policies.yaml")
	writeFileAtomically(t, cfg, `policies:
  open:
    limit: 3
    window: 1m
    on_unavailable: allow
  closed:
    limit: 3
    window: 1m
    on_unavailable: deny
  strict:
    limit: 3
    window: 1m
`)
	r := redistest.Start(t)
	p := startSidecar(t, r.URL(), "--config", cfg)
	c := p.dial(t)
	take := func(policy string) string { return `{"op":"take","subject":"s","policy":"` + policy + `"}` }
	for _, policy := range []string{"open", "closed", "strict"} {
		rep := c.do(take(policy))
		wantTake(t, rep, true, false, 3, 1)
		if _, ok := rep.fields["degraded"]; ok {
			t.Fatalf("a real decision: got %s, want no degraded field", rep)
		}
	}

	r.Stop(t)
	eventually(t, "ping to report redis_ok false", func() bool {
		return !c.do(`{"op":"ping"}`).flag(t, "redis_ok")
	})
	open := c.do(take("open"))
	wantTake(t, open, true, false, 3, 0)
	closed := c.do(take("closed"))
	wantTake(t, closed, false, false, 3, 0)
	for _, rep := range []reply{open, closed} {
		if !strings.HasSuffix(rep.raw, `,"degraded":true}`) {
			t.Fatalf("a degraded answer: got %s, want \"degraded\":true as its last field", rep)
		}
	}
	wantError(t, c.do(take("strict")), "UNAVAILABLE")
	wantError(t, c.do(`{"op":"peek","subject":"s","policy":"open"}`), "UNAVAILABLE")
}
