package integration_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"quotad/integration/redistest"
)

// The longest window: periods aligned to Redis's clock end every 31 days, so
// no decision in these tests meets a boundary.
const slidingConfig = `
policies:
  search:
    algorithm: sliding_window
    limit: 6
    window: 744h
`

// slidingCallers has callers take at once, each with its own request id,
// then retry: exactly want are allowed, and exactly they are replays.
func slidingCallers(t *testing.T, sc *sidecarProc, request string, want int) {
	t.Helper()
	const callers = 16
	conns := make([]*lineConn, callers)
	for i := range conns {
		conns[i] = sc.dial(t)
	}
	replies := make([]reply, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { replies[i] = conns[i].do(fmt.Sprintf(request, i)) })
	}
	wg.Wait()
	allowed := 0
	for i, rep := range replies {
		if !rep.ok() {
			t.Fatalf("%s: caller %d got %s", request, i, rep)
		}
		if rep.flag(t, "allowed") {
			allowed++
		} else if rep.num(t, "retry_after_ms") <= 0 {
			t.Fatalf("%s: denial without retry_after_ms: %s", request, rep)
		}
	}
	if allowed != want {
		t.Fatalf("%s: %d of %d callers allowed, want exactly %d", request, allowed, callers, want)
	}
	again := 0
	for i, c := range conns {
		rep := c.do(fmt.Sprintf(request, i))
		if rep.flag(t, "allowed") != replies[i].flag(t, "allowed") {
			t.Fatalf("%s: retry of caller %d = %s, first answer %s", request, i, rep, replies[i])
		}
		if rep.flag(t, "allowed") {
			again++
			if !rep.flag(t, "replay") {
				t.Fatalf("%s: retry of caller %d = %s, want a replay", request, i, rep)
			}
		}
	}
	if again != want {
		t.Fatalf("%s: %d retries allowed, want %d", request, again, want)
	}
}

// TestSlidingWindowUnderConcurrentCallers drives the built binary from many
// connections at once, by a named policy and inline, on real Redis and on
// the embedded store.
func TestSlidingWindowUnderConcurrentCallers(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(slidingConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, store := range []string{"redis", "embedded"} {
		t.Run(store, func(t *testing.T) {
			var r *redistest.Server
			url := ""
			if store == "redis" {
				r = redistest.Start(t)
				url = r.URL()
			}
			sc := startSidecar(t, url, "--config", cfg)
			slidingCallers(t, sc, `{"op":"take","subject":"u","policy":"search","request_id":"q-%d"}`, 6)
			slidingCallers(t, sc, `{"op":"take","subject":"v","algorithm":"sliding_window","limit":4,"window_ms":2678400000,"cost":2,"request_id":"in-%d"}`, 2)
			c := sc.dial(t)
			if rep := c.do(`{"op":"peek","subject":"u","policy":"search"}`); rep.num(t, "used") != 6 || rep.num(t, "remaining") != 0 {
				t.Fatalf("peek = %s", rep)
			}
			if rep := c.do(`{"op":"take","subject":"v","algorithm":"sliding_window","limit":5,"window_ms":2678400000}`); rep.code() != "POLICY" {
				t.Fatalf("other inline limits on a live window = %s, want POLICY", rep)
			}
			if rep := c.do(`{"op":"take","subject":"v","algorithm":"sliding_window","limit":4,"window_ms":2678400000,"cost":1,"request_id":"in-0"}`); rep.code() != "CONFLICT" && rep.flag(t, "allowed") {
				t.Fatalf("an id again with another cost = %s, want CONFLICT or a denial", rep)
			}
			if r != nil {
				assertKeysHaveTTL(t, r, sc.prefix)
			}
		})
	}
}

// TestCLISlidingWindow: `quotad take` and `quotad peek` with --algorithm
// sliding_window, --limit and --window-ms.
func TestCLISlidingWindow(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	flags := []string{"--algorithm", "sliding_window", "--limit", "3", "--window-ms", "2678400000"}
	stdout, stderr, code := sc.cli(t, "take", append(flags, "--cost", "2", "-r", "cli-1", "alice")...)
	if code != 0 {
		t.Fatalf("take: exit %d, stderr %q", code, stderr)
	}
	if rep := mustParse(t, stdout); !rep.flag(t, "allowed") || rep.num(t, "used") != 2 || rep.num(t, "limit") != 3 {
		t.Fatalf("take = %s", rep)
	}
	stdout, _, code = sc.cli(t, "take", append(flags, "--cost", "2", "--exit-code", "alice")...)
	if rep := mustParse(t, stdout); code != 2 || rep.flag(t, "allowed") || rep.num(t, "retry_after_ms") <= 0 {
		t.Fatalf("take over the limit with --exit-code: exit %d, %s; want 2, denied", code, rep)
	}
	stdout, _, code = sc.cli(t, "peek", append(flags, "alice")...)
	if rep := mustParse(t, stdout); code != 0 || rep.num(t, "used") != 2 || rep.num(t, "remaining") != 1 {
		t.Fatalf("peek: exit %d, %s", code, rep)
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestSlidingWindowOnCluster: a sidecar on a Redis Cluster of three masters
// decides sliding windows of subjects spread over every master, each key on
// its own slot's master with a TTL.
func TestSlidingWindowOnCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	p := startSidecar(t, c.URL())
	key := func(subject string) string { return p.prefix + "sw:{i:" + subject + "}" }
	perMaster := map[*redistest.Server]int{}
	conn := p.dial(t)
	for i := range 30 {
		subject := fmt.Sprintf("user-%d", i)
		perMaster[c.Owner(t, keySlot(key(subject)))]++
		for j := range 4 {
			rep := conn.do(fmt.Sprintf(`{"op":"take","subject":%q,"algorithm":"sliding_window","limit":3,"window_ms":2678400000,"request_id":"r-%d"}`, subject, j))
			if !rep.ok() || rep.flag(t, "allowed") != (j < 3) {
				t.Fatalf("take %d of %s = %s, want the first three allowed", j, subject, rep)
			}
		}
		if rep := conn.do(fmt.Sprintf(`{"op":"take","subject":%q,"algorithm":"sliding_window","limit":3,"window_ms":2678400000,"request_id":"r-0"}`, subject)); !rep.flag(t, "replay") {
			t.Fatalf("retry of %s's first take = %s, want a replay", subject, rep)
		}
		if n := redisInt(t, c.Owner(t, keySlot(key(subject))), "EXISTS", key(subject)); n != 1 {
			t.Fatalf("the key of %s is not on its slot's master", subject)
		}
	}
	for _, m := range c.Masters {
		if perMaster[m] == 0 {
			t.Fatalf("no subject on master %s", m.Addr())
		}
		redistest.AssertAllKeysHaveTTL(t, m.Client(t), p.prefix)
	}
}
