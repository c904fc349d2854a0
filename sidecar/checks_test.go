package sidecar

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
)

const multiPolicies = "policies:\n" +
	"  per-user:\n    limit: 3\n    window: 1m\n" +
	"  per-tenant:\n    limit: 5\n    window: 1m\n" +
	"  tenant-tokens:\n    algorithm: token_bucket\n    rate: 5\n    period: 1h\n"

func multiServer(t *testing.T, cfgText string) (*client, *redistest.Server) {
	t.Helper()
	r := redistest.Start(t)
	cfg, err := policy.ParseConfig([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Store: openStore(t, r.URL()), Config: cfg, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	return c, r
}

// hashes reads every key under the test prefix.
func hashes(t *testing.T, r *redistest.Server) map[string]map[string]string {
	t.Helper()
	rc := r.Client(t)
	keys, err := rc.Do(context.Background(), rc.B().Keys().Pattern(testPrefix+"*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, k := range keys {
		h, err := rc.Do(context.Background(), rc.B().Hgetall().Key(k).Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = h
	}
	return out
}

func sameHashes(t *testing.T, what string, got, want map[string]map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: keys %v, want %v", what, got, want)
	}
	for k, h := range want {
		if len(got[k]) != len(h) {
			t.Fatalf("%s: %s = %v, want %v", what, k, got[k], h)
		}
		for f, v := range h {
			if got[k][f] != v {
				t.Fatalf("%s: %s = %v, want %v", what, k, got[k], h)
			}
		}
	}
}

func userTenant(id string, tenantCost int) string {
	rid := ""
	if id != "" {
		rid = `"request_id":"` + id + `",`
	}
	return `{"op":"take","id":1,` + rid + `"checks":[{"policy":"per-user","subject":"u1"},` +
		`{"policy":"per-tenant","subject":"t1","cost":` + strconv.Itoa(tenantCost) + `},` +
		`{"subject":"g","algorithm":"sliding_window","limit":100,"window_ms":60000}]}`
}

func TestTakeOfChecksThroughTheSocket(t *testing.T) {
	c, r := multiServer(t, multiPolicies)

	raw := c.callRaw(userTenant("a", 2))
	want := `{"id":1,"ok":true,"allowed":true,"replay":false,"retry_after_ms":0,"checks":[` +
		`{"allowed":true,"replay":false,"limit":3,"used":1,"remaining":2,"reset_ms":60000,"retry_after_ms":0},` +
		`{"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60000,"retry_after_ms":0},` +
		`{"allowed":true,"replay":false,"limit":100,"used":1,"remaining":99,`
	if !strings.HasPrefix(raw, want) {
		t.Fatalf("first take\n%s\nwant a reply starting\n%s", raw, want)
	}

	// The tenant has 3 left: cost 4 denies the take, and nothing is consumed.
	before := hashes(t, r)
	got := c.call(userTenant("b", 4))
	if !got.OK || got.Allowed || got.Replay || len(got.Checks) != 3 {
		t.Fatalf("take past the tenant's limit = %+v", got)
	}
	u, ten := got.Checks[0], got.Checks[1]
	if !u.Allowed || u.Used != 1 || u.Remaining != 2 || ten.Allowed || ten.Used != 2 || ten.RetryAfterMS <= 0 ||
		got.RetryAfterMS != ten.RetryAfterMS {
		t.Fatalf("denied take's checks = %+v: want the user's as it is (used 1) and the tenant's denial", got.Checks)
	}
	sameHashes(t, "after the denied take", hashes(t, r), before)

	// The same request id replays every check.
	got = c.call(userTenant("a", 2))
	if !got.Allowed || !got.Replay || !got.Checks[0].Replay || got.Checks[0].Used != 1 || got.Checks[1].Used != 2 {
		t.Fatalf("replay = %+v", got)
	}
	sameHashes(t, "after the replay", hashes(t, r), before)

	// Another cost, or another set of checks, under the same id: CONFLICT.
	for _, line := range []string{
		userTenant("a", 1),
		`{"op":"take","request_id":"a","checks":[{"policy":"per-user","subject":"u1"}]}`,
	} {
		got = c.call(line)
		checkCode(t, line, got, protocol.CodeConflict)
	}
	sameHashes(t, "after the conflicts", hashes(t, r), before)

	// Refusals name the check.
	for _, tc := range []struct {
		line string
		code protocol.Code
		msg  string
	}{
		{`{"op":"take","checks":[{"policy":"per-user","subject":"u1"},{"policy":"nope","subject":"u1"}]}`,
			protocol.CodeUnknownPolicy, "check 2: no policy named"},
		{`{"op":"take","checks":[{"policy":"per-user","subject":"u1"},{"policy":"per-user","subject":"u1","cost":2}]}`,
			protocol.CodeInvalid, "checks 1 and 2 count against the same limit and subject"},
		{`{"op":"take","checks":[{"policy":"per-user","subject":"u1","cost":4}]}`,
			protocol.CodeInvalid, "check 1: cost 4 exceeds the limit 3"},
		{`{"op":"take","checks":[{"subject":"u1","algorithm":"concurrency","limit":1,"lease_ms":1000}]}`,
			protocol.CodeInvalid, "check 1: "},
	} {
		got = c.call(tc.line)
		checkCode(t, tc.line, got, tc.code)
		if !strings.Contains(got.Message, tc.msg) {
			t.Errorf("%s: message %q, want %q", tc.line, got.Message, tc.msg)
		}
	}
	sameHashes(t, "after the refusals", hashes(t, r), before)
}

// Requests of one connection on the same key run in order, when one of
// them is a take of several: a pipelined take of one limit behind a take
// of checks that exhausts it is denied, and the next take of checks waits
// for both.
func TestTakeOfChecksKeepsSameKeyOrder(t *testing.T) {
	c, _ := multiServer(t, "policies:\n  one:\n    limit: 1\n    window: 1m\n  two:\n    limit: 2\n    window: 1m\n")
	for round := range 20 {
		s := "s" + strconv.Itoa(round)
		c.send(
			`{"op":"take","id":1,"checks":[{"policy":"two","subject":"`+s+`"},{"policy":"one","subject":"`+s+`"}]}`,
			`{"op":"take","id":2,"policy":"one","subject":"`+s+`"}`,
			`{"op":"take","id":3,"policy":"two","subject":"`+s+`"}`,
			`{"op":"take","id":4,"checks":[{"policy":"two","subject":"`+s+`"},{"policy":"one","subject":"x`+s+`"}]}`,
		)
		first, second, third, fourth := c.recv(), c.recv(), c.recv(), c.recv()
		if !first.Allowed || second.Allowed || !third.Allowed || fourth.Allowed || fourth.Checks[0].Allowed {
			t.Fatalf("round %d: %+v, %+v, %+v, %+v: want allowed, denied, allowed, denied by two", round, first, second, third, fourth)
		}
	}
}

// 50 callers on their own connections take overlapping checks at once: no
// budget admits more than its limit, and each budget's use is what the
// accepted takes that name it consumed, so no denied take left a trace.
func TestTakeOfChecksFiftyCallersNeverOverAdmit(t *testing.T) {
	r := redistest.Start(t)
	cfg, err := policy.ParseConfig([]byte("policies:\n  per-user:\n    limit: 4\n    window: 1m\n  per-tenant:\n    limit: 30\n    window: 1m\n  global:\n    algorithm: token_bucket\n    rate: 1\n    period: 1h\n    burst: 60\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Store: openStore(t, r.URL()), Config: cfg})
	waitRedisOK(t, ts.dial(t))
	const callers, takes = 50, 4
	var mu sync.Mutex
	consumed := map[string]int64{}
	var wg sync.WaitGroup
	for g := range callers {
		c := ts.dial(t)
		wg.Go(func() {
			for i := range takes {
				user, tenant := "u"+strconv.Itoa(g%10), "t"+strconv.Itoa(g%3)
				cost := 1 + (g+i)%2
				line := `{"op":"take","request_id":"r` + strconv.Itoa(g) + `-` + strconv.Itoa(i) + `","checks":[` +
					`{"policy":"per-user","subject":"` + user + `"},{"policy":"per-tenant","subject":"` + tenant + `","cost":` + strconv.Itoa(cost) + `},` +
					`{"policy":"global","subject":"all"}]}`
				c.send(line)
				raw := c.recvRaw()
				got := decodeReply(t, raw)
				if !got.OK {
					t.Errorf("take: %s", raw)
					return
				}
				if got.Allowed {
					mu.Lock()
					consumed["fw:{p:per-user:"+user+"}"]++
					consumed["fw:{p:per-tenant:"+tenant+"}"] += int64(cost)
					consumed["tb"]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var accepted int64
	for k, h := range hashes(t, r) {
		name := strings.TrimPrefix(k, testPrefix)
		if strings.HasPrefix(name, "tb:") {
			continue
		}
		used, _ := strconv.ParseInt(h["used"], 10, 64)
		limit := int64(4)
		if strings.Contains(name, "per-tenant") {
			limit = 30
		}
		if used > limit || used != consumed[name] {
			t.Errorf("%s: used %d, limit %d, accepted takes consumed %d", name, used, limit, consumed[name])
		}
	}
	accepted = consumed["tb"]
	if accepted == 0 || accepted == callers*takes {
		t.Fatalf("%d of %d takes accepted: the limits were not contended", accepted, callers*takes)
	}
	// The bucket held 60 and refills one an hour: its tokens left are what
	// the accepted takes did not spend.
	c := ts.dial(t)
	got := c.call(`{"op":"peek","policy":"global","subject":"all"}`)
	if got.Remaining != 60-accepted {
		t.Fatalf("bucket remaining %d, want %d", got.Remaining, 60-accepted)
	}
}
