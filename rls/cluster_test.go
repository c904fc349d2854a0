package rls_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"quotad/integration/redistest"
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
