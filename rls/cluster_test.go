package rls_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"quotad/dispatch"
	"quotad/integration/redistest"
	"quotad/keyslot"
	"quotad/limits"
	"quotad/protocol"
)

// On a Redis Cluster a call's counters are on several nodes: the take
// goes in steps (dispatch/steps.go), and still takes all or nothing.
func TestCluster(t *testing.T) {
	// Registered first, so it runs once the store has closed.
	t.Cleanup(func() { waitGone(t, closeRemovedConns) })
	c := redistest.StartCluster(t, 3)
	e := setupOn(t, c.URL(), edge+`  - key: wide
    rate_limit: {unit: day, requests_per_unit: 100}
`, apiPolicy)
	// Counters of many values, spread over the slots.
	users := []string{"u1", "u2", "u3", "u4", "u5", "u6"}
	for _, u := range users {
		req := request("edge", []string{"user", u}, []string{"tenant", "t-" + u}, []string{"wide", "w"})
		if resp := e.call(req); resp.GetOverallCode() != ok || !slices.Equal(remaining(resp), []uint32{2, 0, 99 - uint32(slices.Index(users, u))}) {
			t.Fatalf("%s first = %v, want OK", u, resp)
		}
		resp := e.call(req)
		if resp.GetOverallCode() != over || !slices.Equal(statusCodes(resp), []rlsv3.RateLimitResponse_Code{ok, over, ok}) {
			t.Fatalf("%s second = %v, want OVER_LIMIT by the tenant", u, resp)
		}
	}
	// The denied calls took nothing from the user's or the shared counter.
	resp := e.call(hits(hits(request("edge", []string{"user", "u1"}, []string{"wide", "w"}), 0, 0), 1, 0))
	resp2 := e.call(hits(request("edge", []string{"wide", "w"}), 0, 0))
	if !slices.Equal(remaining(resp), []uint32{2, 100 - uint32(len(users))}) || remaining(resp2)[0] != 100-uint32(len(users)) {
		t.Fatalf("after the denied calls: user %v, wide %v; want 2 and %d remaining", resp, resp2, 100-len(users))
	}
	// The socket's takes of a policy count in the same window.
	if o := e.take("api", "shop", 3); !o.Allowed {
		t.Fatalf("socket take = %+v", o)
	}
	if resp := e.call(request("edge", []string{"app", "shop"}, []string{"user", "u9"})); resp.GetOverallCode() != ok || remaining(resp)[0] != 0 {
		t.Fatalf("rls after the socket's take = %v, want OK with 0 remaining", resp)
	}
	// Concurrent callers on a Cluster never exceed the shared counter.
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for g := range 20 {
		wg.Go(func() {
			for i := range 10 {
				resp, err := e.callErr(request("edge", []string{"wide", "w"}, []string{"path", "/login"}, []string{"user", "c" + string(rune('a'+(g*10+i)%26))}))
				if err != nil {
					t.Errorf("call: %v", err)
					return
				}
				if resp.GetOverallCode() == ok {
					mu.Lock()
					passed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	path := e.call(hits(request("edge", []string{"path", "/login"}), 0, 0))
	if passed > 5 || 5-remaining(path)[0] != uint32(passed) {
		t.Fatalf("%d calls passed, path counter %v: want at most 5, equal", passed, path)
	}
}

// closeRemovedConns is the goroutine a rueidis slot map refresh leaves to
// close, five seconds later, the connections of nodes that left the map.
// Client.Close does not stop it: it is slow to exit, not leaked.
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

// On a Cluster, a call of the file's counters and one quotad policy is
// taken in two steps without a request id: its windows keep no record
// per call, so no rate of calls fills them, and a call the policy denies
// gives the file's counters back, one the file denies takes nothing of
// the policy.
func TestClusterPolicyWithoutRecords(t *testing.T) {
	t.Cleanup(func() { waitGone(t, closeRemovedConns) })
	c := redistest.StartCluster(t, 3)
	e := setupOn(t, c.URL(), edge+`  - key: wide
    rate_limit: {unit: day, requests_per_unit: 100}
`, apiPolicy)
	// api allows 4 a day: the fifth call on is denied by the policy.
	for i := range 8 {
		resp := e.call(request("edge", []string{"wide", "w"}, []string{"app", "shop"}))
		want := []rlsv3.RateLimitResponse_Code{ok, ok}
		if i >= 4 {
			want[1] = over
		}
		if !slices.Equal(statusCodes(resp), want) || (resp.GetOverallCode() == ok) != (i < 4) {
			t.Fatalf("call %d = %v, want %v", i+1, resp, want)
		}
	}
	if resp := e.call(hits(request("edge", []string{"wide", "w"}), 0, 0)); remaining(resp)[0] != 96 {
		t.Fatalf("wide after 4 calls passed and 4 denied = %v, want 96 remaining", resp)
	}
	// The file denies: the policy is not asked and keeps its budget.
	for i := range 2 {
		resp := e.call(request("edge", []string{"tenant", "t"}, []string{"app", "other"}))
		if (resp.GetOverallCode() == ok) != (i == 0) || !slices.Equal(statusCodes(resp)[1:], []rlsv3.RateLimitResponse_Code{ok}) {
			t.Fatalf("tenant call %d = %v", i+1, resp)
		}
	}
	if resp := e.call(hits(request("edge", []string{"app", "other"}), 0, 0)); remaining(resp)[0] != 3 {
		t.Fatalf("api for other after one call passed = %v, want 3 remaining", resp)
	}
	// No window of the domain holds a request id record.
	srv := c.Owner(t, int(keyslot.Of("{edge}")))
	ks, err := srv.Do(t, "KEYS", "*{edge}*").AsStrSlice()
	if err != nil || len(ks) < 2 {
		t.Fatalf("keys of the domain: %v, %v", ks, err)
	}
	for _, k := range ks {
		fields, err := srv.Do(t, "HGETALL", k).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range fields {
			if strings.HasPrefix(f, "r:") || f == "ids" && v != "0" {
				t.Errorf("%s holds %s = %s", k, f, v)
			}
		}
	}
}

// A give back pinned to a window (dispatch.Given.Period) gives back to
// that window while Redis's clock is in it, and to no other window.
func TestPinnedGiveBack(t *testing.T) {
	e := setup(t, edge+`  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 100}
`, apiPolicy)
	for range 3 {
		e.call(request("edge", []string{"wide", "w"}))
	}
	giveBack := func(period int64) dispatch.Outcome {
		t.Helper()
		req := &protocol.Request{Op: protocol.OpPeek, Subject: "4:edge4:wide1:w", Cost: 1}
		g := &dispatch.Given{Shape: limits.EpochWindow(100, 60), Name: "rls:edge", Counter: "{edge}4:edge4:wide1:w", GiveBack: true, Period: period}
		done := make(chan struct{})
		var dec dispatch.Decision
		dec.Done = func() { close(done) }
		if _, decided := e.d.PrepareGiven(req, []*dispatch.Given{g}, &dec); !decided {
			e.d.Run(&dec)
		}
		<-done
		return dec.Out
	}
	now := time.Now().UnixMilli()
	if ms := now % 60_000; ms < 1_000 || ms > 59_000 {
		time.Sleep(2 * time.Second) // not across a minute's end
		now = time.Now().UnixMilli()
	}
	start := now - now%60_000
	// Redis's clock is in none of them: refused.
	for _, other := range []int64{start - 60_000, start + 60_000, start - 120_000} {
		if o := giveBack(other); !o.Failed() {
			t.Errorf("give back to the window at %d, not now's: %+v, want refused", other, o)
		}
	}
	if resp := e.call(hits(request("edge", []string{"wide", "w"}), 0, 0)); remaining(resp)[0] != 97 {
		t.Fatalf("after give backs to other windows: %v, want 97 remaining", resp)
	}
	if o := giveBack(start); o.Failed() || o.Remaining != 98 {
		t.Fatalf("give back to the window = %+v, want 98 remaining", o)
	}
}
