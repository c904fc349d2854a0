package integration_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"quotad/integration/redistest"
	"quotad/keyslot"
	"quotad/luascript"
)

// On a Redis Cluster a take of several limits is one script when its keys
// share a slot: subjects that hold the same hash tag ({tenant-3}) do,
// whatever their policies and algorithms. 50 callers take a user's and a
// tenant's limits at once, with tenants on every master: no budget ever
// admits more than its limit, and each budget holds exactly what the
// accepted takes consumed. A take whose keys are in several slots is
// refused before anything is sent.
func TestTakeOfChecksOnACluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	p := launchSidecar(t, socketPath(t), c.URL())
	p.waitReady(t)

	// Three tenants whose tags are on three different masters.
	var tenants []string
	owners := map[*redistest.Server]bool{}
	for n := 0; len(tenants) < 3; n++ {
		tag := "{tenant-" + strconv.Itoa(n) + "}"
		if o := c.Owner(t, int(keyslot.Of(tag))); !owners[o] {
			owners[o] = true
			tenants = append(tenants, tag)
		}
	}
	const userLimit, tenantLimit, callers, takes = 3, 25, 50, 4
	userKey := func(tenant string, u int) string {
		return luascript.FixedWindowKey(p.prefix, "", tenant+":user-"+strconv.Itoa(u))
	}
	tenantKey := func(tenant string) string { return luascript.SlidingWindowKey(p.prefix, "", tenant) }

	var mu sync.Mutex
	consumed := map[string]int64{}
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		conn, err := dialLines(p.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.nc.Close() })
		wg.Go(func() {
			tenant, u := tenants[g%3], g%7
			for i := range takes {
				cost := 1 + (g+i)%3
				line := `{"op":"take","request_id":"r` + strconv.Itoa(g) + `-` + strconv.Itoa(i) + `","checks":[` +
					`{"subject":"` + tenant + `:user-` + strconv.Itoa(u) + `","limit":` + strconv.Itoa(userLimit) + `,"window_ms":600000},` +
					`{"subject":"` + tenant + `","algorithm":"sliding_window","limit":` + strconv.Itoa(tenantLimit) + `,"window_ms":600000,"cost":` + strconv.Itoa(cost) + `}]}`
				rep, err := conn.roundTrip(line)
				if err != nil || !rep.ok() {
					errs <- fmt.Errorf("take %s: %v %s", line, err, rep)
					return
				}
				if rep.fields["allowed"] == true {
					mu.Lock()
					consumed[userKey(tenant, u)]++
					consumed[tenantKey(tenant)] += int64(cost)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var accepted int64
	for _, tenant := range tenants {
		owner := c.Owner(t, int(keyslot.Of(tenant)))
		for u := range 7 {
			k := userKey(tenant, u)
			used := int64(0)
			if s, err := owner.Do(t, "HGET", k, "used").ToString(); err == nil {
				used, _ = strconv.ParseInt(s, 10, 64)
			}
			if used > userLimit || used != consumed[k] {
				t.Errorf("%s: used %d, limit %d, accepted takes consumed %d", k, used, userLimit, consumed[k])
			}
			accepted += used
		}
		k := tenantKey(tenant)
		counted := int64(0)
		if s, err := owner.Do(t, "HGET", k, "c").ToString(); err == nil {
			counted, _ = strconv.ParseInt(s, 10, 64)
		}
		if counted > tenantLimit || counted != consumed[k] {
			t.Errorf("%s: counted %d, limit %d, accepted takes consumed %d", k, counted, tenantLimit, consumed[k])
		}
	}
	if accepted == 0 || accepted == callers*takes {
		t.Fatalf("%d of %d takes accepted: the limits were not contended", accepted, callers*takes)
	}

	// Keys in several slots without a request_id: INVALID, nothing written.
	conn := p.dial(t)
	rep := conn.do(`{"op":"take","checks":[{"subject":"alone-a","limit":5,"window_ms":60000},{"subject":"alone-b","limit":5,"window_ms":60000}]}`)
	wantError(t, rep, "INVALID")
	for _, s := range []string{"alone-a", "alone-b"} {
		k := luascript.FixedWindowKey(p.prefix, "", s)
		if n := redisInt(t, c.Owner(t, int(keyslot.Of(k))), "EXISTS", k); n != 0 {
			t.Errorf("%s exists after the refused take", k)
		}
	}
	raw, _ := json.Marshal(rep.fields["message"])
	t.Logf("cross-slot take without request_id: %s; %d takes accepted over %d masters", raw, accepted, len(owners))
}

// subjectsOnMasters finds n subjects whose keys (by key) are on n
// different masters.
func subjectsOnMasters(t *testing.T, c *redistest.Cluster, n int, key func(subject string) string, name string) []string {
	t.Helper()
	var out []string
	owners := map[*redistest.Server]bool{}
	for i := 0; len(out) < n; i++ {
		s := name + "-" + strconv.Itoa(i)
		if o := c.Owner(t, int(keyslot.Of(key(s)))); !owners[o] {
			owners[o] = true
			out = append(out, s)
		}
	}
	return out
}

// On a Redis Cluster, a take whose checks are on different masters is
// taken a master at a time, and a denial gives back what the earlier steps
// took: 50 callers on checks spread over three masters never over-admit,
// and each budget holds exactly what the accepted takes consumed, though
// every denied take had taken the user's step first.
func TestTakeOfChecksStepsOnACluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	p := launchSidecar(t, socketPath(t), c.URL())
	p.waitReady(t)
	fw := func(s string) string { return luascript.FixedWindowKey(p.prefix, "", s) }
	sw := func(s string) string { return luascript.SlidingWindowKey(p.prefix, "", s) }
	tb := func(s string) string { return luascript.TokenBucketKey(p.prefix, "", s) }
	ms := subjectsOnMasters(t, c, 3, fw, "user")
	user := ms[0]
	var tenant, global string
	for i := 0; tenant == "" || global == ""; i++ {
		s := "x-" + strconv.Itoa(i)
		if tenant == "" && c.Owner(t, int(keyslot.Of(sw(s)))) == c.Owner(t, int(keyslot.Of(fw(ms[1])))) {
			tenant = s
		}
		if global == "" && c.Owner(t, int(keyslot.Of(tb(s)))) == c.Owner(t, int(keyslot.Of(fw(ms[2])))) {
			global = s
		}
	}
	// The user's limit never binds: every denial comes from a later step,
	// after the user's step was taken, and must give it back.
	const userLimit, tenantLimit, burst, callers, takes = 150, 40, 18, 50, 4
	var mu sync.Mutex
	var consumedUser, consumedTenant, accepted int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		conn, err := dialLines(p.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.nc.Close() })
		wg.Go(func() {
			for i := range takes {
				cost := 1 + (g+i)%3
				line := `{"op":"take","request_id":"s` + strconv.Itoa(g) + `-` + strconv.Itoa(i) + `","checks":[` +
					`{"subject":"` + user + `","limit":` + strconv.Itoa(userLimit) + `,"window_ms":600000},` +
					`{"subject":"` + tenant + `","algorithm":"sliding_window","limit":` + strconv.Itoa(tenantLimit) + `,"window_ms":600000,"cost":` + strconv.Itoa(cost) + `},` +
					`{"subject":"` + global + `","algorithm":"token_bucket","rate":1,"period_ms":3600000,"burst":` + strconv.Itoa(burst) + `}]}`
				rep, err := conn.roundTrip(line)
				if err != nil || !rep.ok() {
					errs <- fmt.Errorf("take %s: %v %s", line, err, rep)
					return
				}
				if rep.fields["allowed"] == true {
					mu.Lock()
					consumedUser++
					consumedTenant += int64(cost)
					accepted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	read := func(key, field string) int64 {
		s, err := c.Owner(t, int(keyslot.Of(key))).Do(t, "HGET", key, field).ToString()
		if err != nil {
			return 0
		}
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	if used := read(fw(user), "used"); used > userLimit || used != consumedUser {
		t.Errorf("user window: used %d, limit %d, accepted takes consumed %d", used, userLimit, consumedUser)
	}
	if counted := read(sw(tenant), "c"); counted > tenantLimit || counted != consumedTenant {
		t.Errorf("tenant window: counted %d, limit %d, accepted takes consumed %d", counted, tenantLimit, consumedTenant)
	}
	conn := p.dial(t)
	peek := conn.do(`{"op":"peek","subject":"` + global + `","algorithm":"token_bucket","rate":1,"period_ms":3600000,"burst":` + strconv.Itoa(burst) + `}`)
	if peek.num(t, "remaining") != burst-accepted {
		t.Errorf("global bucket: %s, want %d tokens left", peek, burst-accepted)
	}
	if accepted == 0 || accepted >= callers*takes/2 {
		t.Fatalf("%d of %d takes accepted: the later steps did not deny enough to test the give back", accepted, callers*takes)
	}
	t.Logf("%d of %d takes accepted over three masters; user used %d, tenant %d", accepted, callers*takes, consumedUser, consumedTenant)
}

// A sidecar killed between the steps of a take leaves the first step's
// cost taken, for no longer than that check's window; a retry with the
// same request_id on a new sidecar replays it and completes the take,
// counting each check once.
func TestTakeOfChecksStepsSidecarKilledBetweenSteps(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	p := launchSidecar(t, socketPath(t), c.URL(), "--redis-timeout", "30s")
	p.waitReady(t)
	fw := func(s string) string { return luascript.FixedWindowKey(p.prefix, "", s) }
	ss := subjectsOnMasters(t, c, 2, fw, "k")
	first, second := c.Owner(t, int(keyslot.Of(fw(ss[0])))), c.Owner(t, int(keyslot.Of(fw(ss[1]))))
	line := `{"op":"take","request_id":"kill-1","checks":[{"subject":"` + ss[0] + `","limit":5,"window_ms":60000},` +
		`{"subject":"` + ss[1] + `","limit":5,"window_ms":60000}]}`

	// The second master holds writes: the take waits in its second step.
	if err := second.Do(t, "CLIENT", "PAUSE", "60000", "WRITE").Error(); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if err := second.Do(t, "CLIENT", "UNPAUSE").Error(); err != nil {
				t.Errorf("CLIENT UNPAUSE: %v", err)
			}
		}
	}
	t.Cleanup(unpause)
	conn := p.dial(t)
	conn.send(line)
	eventually(t, "the first step to be taken", func() bool {
		n, err := first.Do(t, "HEXISTS", fw(ss[0]), "r:kill-1").AsInt64()
		return err == nil && n == 1
	})
	p.wantStatus = -1 // killed by a signal
	p.signal(t, syscall.SIGKILL)
	p.wait(t)
	unpause()

	// What the first step took is bounded by its window.
	if used := redisInt(t, first, "HGET", fw(ss[0]), "used"); used != 1 {
		t.Fatalf("first check's window: used %d, want 1", used)
	}
	if ttl := redisInt(t, first, "PTTL", fw(ss[0])); ttl <= 0 || ttl > 60000 {
		t.Fatalf("first check's window PTTL %d: the cost it holds must end with its window", ttl)
	}

	// A new sidecar: the retry replays the first step and takes the second.
	p2 := launchSidecar(t, socketPath(t), c.URL(), "--key-prefix", p.prefix)
	p2.prefix = p.prefix
	p2.waitReady(t)
	rep := p2.dial(t).do(line)
	if !rep.ok() || rep.fields["allowed"] != true {
		t.Fatalf("retry after the kill: %s", rep)
	}
	checks, _ := rep.fields["checks"].([]any)
	if len(checks) != 2 || checks[0].(map[string]any)["replay"] != true {
		t.Fatalf("retry %s: want the first check replayed", rep)
	}
	for i, s := range ss {
		if used := redisInt(t, c.Owner(t, int(keyslot.Of(fw(s)))), "HGET", fw(s), "used"); used != 1 {
			t.Errorf("check %d: used %d after the retry, want 1", i+1, used)
		}
	}
}
