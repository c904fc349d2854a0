package integration_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// On a Redis Cluster a take of several limits is one script when its keys
// share a slot: subjects that hold the same hash tag ({tenant-3}) do,
// whatever their policies and algorithms. 50 callers take a user's and a
// tenant's limits at once, with tenants on every master: no budget ever
// admits more than its limit, and each budget holds exactly what the
// accepted takes consumed. A take whose keys are in several slots is
// refused before anything is sent.
func TestMultiTakeOnACluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	p := launchSidecar(t, socketPath(t), c.URL())
	p.waitReady(t)

	// Three tenants whose tags are on three different masters.
	var tenants []string
	owners := map[*redistest.Server]bool{}
	for n := 0; len(tenants) < 3; n++ {
		tag := "{tenant-" + strconv.Itoa(n) + "}"
		if o := c.Owner(t, int(luascript.KeySlot(tag))); !owners[o] {
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
		owner := c.Owner(t, int(luascript.KeySlot(tenant)))
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

	// Keys in several slots: INVALID, and nothing written on any master.
	conn := p.dial(t)
	rep := conn.do(`{"op":"take","checks":[{"subject":"alone-a","limit":5,"window_ms":60000},{"subject":"alone-b","limit":5,"window_ms":60000}]}`)
	wantError(t, rep, "INVALID")
	for _, s := range []string{"alone-a", "alone-b"} {
		k := luascript.FixedWindowKey(p.prefix, "", s)
		if n := redisInt(t, c.Owner(t, int(luascript.KeySlot(k))), "EXISTS", k); n != 0 {
			t.Errorf("%s exists after the refused take", k)
		}
	}
	raw, _ := json.Marshal(rep.fields["message"])
	t.Logf("cross-slot take: %s; %d takes accepted over %d masters", raw, accepted, len(owners))
}
