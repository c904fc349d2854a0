package rls_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// While Redis cannot answer, a descriptor whose quotad policy says what
// to do answers so; any other call fails with UNAVAILABLE, from the
// breaker once it is open, so that Envoy's failure_mode_deny decides.
func TestRedisDown(t *testing.T) {
	e := setup(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: open
    rate_limit: {quotad_policy: open}
  - key: closed
    rate_limit: {quotad_policy: closed}
`, `
policies:
  open:
    limit: 5
    window: 1h
    on_unavailable: allow
  closed:
    limit: 5
    window: 1h
    on_unavailable: deny
`)
	if resp := e.call(request("d", []string{"k", "v"})); resp.GetOverallCode() != ok {
		t.Fatalf("with redis up = %v", resp)
	}
	e.redis.Stop(t)
	deadline := time.Now().Add(waitTimeout)
	for {
		_, err := e.callErr(request("d", []string{"k", "v"}))
		if status.Code(err) == codes.Unavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with redis down: %v, want UNAVAILABLE", err)
		}
	}
	if resp := e.call(request("d", []string{"open", "x"})); resp.GetOverallCode() != ok {
		t.Errorf("on_unavailable allow = %v, want OK", resp)
	}
	if resp := e.call(request("d", []string{"closed", "x"})); resp.GetOverallCode() != over {
		t.Errorf("on_unavailable deny = %v, want OVER_LIMIT", resp)
	}
	// A call with a descriptor whose answer is not known fails whole.
	if _, err := e.callErr(request("d", []string{"open", "x"}, []string{"k", "v"})); status.Code(err) != codes.Unavailable {
		t.Errorf("mixed call: %v, want UNAVAILABLE", err)
	}
}

// 50 callers with overlapping descriptors: no counter ever passes its
// limit, and a denied call leaves every counter as it was, so each
// counter holds exactly the calls that were answered OK.
func TestConcurrentCallersNeverExceed(t *testing.T) {
	e := setup(t, `
domain: c
descriptors:
  - key: a
    rate_limit: {unit: day, requests_per_unit: 30}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 20}
  - key: c
    rate_limit: {unit: day, requests_per_unit: 25}
`, apiPolicy)
	limit := map[string]uint32{"a": 30, "b": 20, "c": 25}
	pairs := [][2]string{{"a", "b"}, {"b", "c"}, {"a", "c"}}
	var mu sync.Mutex
	passed := map[string]uint32{}
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := range 8 {
				p := pairs[(g+i)%3]
				resp, err := e.callErr(request("c", []string{p[0], "x"}, []string{p[1], "x"}))
				if err != nil {
					t.Errorf("call: %v", err)
					return
				}
				if resp.GetOverallCode() == ok {
					mu.Lock()
					passed[p[0]]++
					passed[p[1]]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, k := range []string{"a", "b", "c"} {
		resp := e.call(hits(request("c", []string{k, "x"}), 0, 0))
		used := limit[k] - remaining(resp)[0]
		if passed[k] > limit[k] || used != passed[k] {
			t.Errorf("%s: %d calls passed, the counter holds %d, limit %d: want equal and at most the limit", k, passed[k], used, limit[k])
		}
	}
	if got := statusCodes(e.call(request("c", []string{"b", "x"}))); !slices.Equal(got, []rlsv3.RateLimitResponse_Code{over}) {
		t.Errorf("b after 400 calls: %v, want OVER_LIMIT", got)
	}
}

// A caller that leaves while its decision waits for Redis gets its
// deadline's error at once; the decision ends on its own (its take may
// still count), and the calls after it, which reuse the service's plans
// and decisions, are answered and counted as usual.
func TestCallerLeavesWhileRedisWaits(t *testing.T) {
	e := setup(t, `
domain: s
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 100}
`, apiPolicy)
	both := func() *rlsv3.RateLimitRequest { return request("s", []string{"k", "v"}, []string{"k", "w"}) }
	c := e.redis.Client(t)
	if err := c.Do(t.Context(), c.B().ClientPause().Timeout(600).All().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err := e.client.ShouldRateLimit(ctx, both())
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call whose caller left: %v, want DEADLINE_EXCEEDED", err)
	}
	// Once Redis answers again (the breaker may have opened meanwhile).
	deadline := time.Now().Add(waitTimeout)
	var calls uint32
	for {
		resp, err := e.callErr(both())
		if err == nil && resp.GetOverallCode() == ok {
			calls++
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the pause: %v, %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 20 {
		if resp := e.call(both()); resp.GetOverallCode() != ok {
			t.Fatalf("after the pause: %v", resp)
		}
		calls++
	}
	for i, r := range remaining(e.call(hits(hits(both(), 0, 0), 1, 0))) {
		if used := 100 - r; used != calls && used != calls+1 {
			t.Errorf("counter %d holds %d: want the %d calls answered, and at most one more for the call whose caller left", i, used, calls)
		}
	}
}
