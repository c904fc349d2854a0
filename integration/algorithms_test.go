package integration_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"quotad/integration/redistest"
)

const algorithmsConfig = `
policies:
  uploads:
    algorithm: token_bucket
    rate: 1
    period: 1h
    burst: 10
  exports:
    algorithm: concurrency
    limit: 3
    lease: 1m
`

// TestAlgorithmsUnderConcurrentCallers drives the built binary from many
// connections at once, on real Redis and on the embedded store that
// `make run` uses: no algorithm ever admits more than its limit, and every
// key left behind has a TTL.
func TestAlgorithmsUnderConcurrentCallers(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(algorithmsConfig), 0o600); err != nil {
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
			const callers = 16
			for _, tc := range []struct {
				name, request string
				want          int
			}{
				{"token bucket", `{"op":"take","subject":"u","policy":"uploads","request_id":"up-%d"}`, 10},
				{"concurrency", `{"op":"take","subject":"u","policy":"exports","request_id":"job-%d"}`, 3},
				{"inline token bucket", `{"op":"take","subject":"v","algorithm":"token_bucket","rate":1,"period_ms":60000,"burst":4,"request_id":"in-%d"}`, 4},
				{"inline concurrency", `{"op":"take","subject":"v","algorithm":"concurrency","limit":5,"lease_ms":60000,"request_id":"in-%d"}`, 5},
			} {
				conns := make([]*lineConn, callers)
				for i := range conns {
					conns[i] = sc.dial(t)
				}
				replies := make([]reply, callers)
				var wg sync.WaitGroup
				for i := range callers {
					wg.Go(func() { replies[i] = conns[i].do(fmt.Sprintf(tc.request, i)) })
				}
				wg.Wait()
				allowed := 0
				for i, rep := range replies {
					if !rep.ok() {
						t.Fatalf("%s: caller %d got %s", tc.name, i, rep)
					}
					if rep.flag(t, "allowed") {
						allowed++
					}
				}
				if allowed != tc.want {
					t.Fatalf("%s: %d of %d callers allowed, want exactly %d", tc.name, allowed, callers, tc.want)
				}
				// Each retry is a replay for the accepted, still a denial for
				// the others: nothing more is admitted.
				again := 0
				for i, c := range conns {
					rep := c.do(fmt.Sprintf(tc.request, i))
					if rep.flag(t, "allowed") != replies[i].flag(t, "allowed") {
						t.Fatalf("%s: retry of caller %d = %s, first answer %s", tc.name, i, rep, replies[i])
					}
					if rep.flag(t, "allowed") {
						again++
						if !rep.flag(t, "replay") {
							t.Fatalf("%s: retry of caller %d = %s, want a replay", tc.name, i, rep)
						}
					}
				}
				if again != tc.want {
					t.Fatalf("%s: %d retries allowed, want %d", tc.name, again, tc.want)
				}
			}
			// A release frees a slot for one more caller, and only one.
			c := sc.dial(t)
			holder := -1
			for i := range callers {
				if c.do(fmt.Sprintf(`{"op":"release","subject":"u","policy":"exports","request_id":"job-%d"}`, i)).flag(t, "released") {
					holder = i
					break
				}
			}
			if holder < 0 {
				t.Fatal("no caller's lease could be released")
			}
			if rep := c.do(`{"op":"take","subject":"u","policy":"exports","request_id":"late-1"}`); !rep.flag(t, "allowed") {
				t.Fatalf("take after a release = %s, want allowed", rep)
			}
			if rep := c.do(`{"op":"take","subject":"u","policy":"exports","request_id":"late-2"}`); rep.flag(t, "allowed") {
				t.Fatalf("second take after one release = %s, want denied", rep)
			}
			if r != nil {
				assertKeysHaveTTL(t, r, sc.prefix)
			}
		})
	}
}

// TestReadmeAlgorithmExamples runs the README's examples of the other
// algorithms: the Python and Node snippets as pasted next to a copy of the
// client, and the requests of its console sessions, whose replies must
// match those shown (times excepted, as in the protocol examples).
func TestReadmeAlgorithmExamples(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	readme, err := os.ReadFile(filepath.Join(moduleRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := regexp.MustCompile("(?s)\n## Token bucket and concurrency leases\n(.*?)\n## ").FindSubmatch(readme)
	if section == nil {
		t.Fatal("README.md has no section on token bucket and concurrency leases")
	}
	sessions := regexp.MustCompile("(?s)```console\n(.*?)```").FindAllSubmatch(section[1], -1)
	if len(sessions) != 2 {
		t.Fatalf("found %d console sessions in the section, want 2", len(sessions))
	}
	for i, s := range sessions {
		reqs := regexp.MustCompile(`'(\{"op".*?\})'`).FindAllSubmatch(s[1], -1)
		wants := regexp.MustCompile(`(?m)^\{"ok".*$`).FindAll(s[1], -1)
		if len(reqs) == 0 || len(reqs) != len(wants) {
			t.Fatalf("console session %d: %d requests, %d replies", i, len(reqs), len(wants))
		}
		c := sc.dial(t)
		for j := range reqs {
			got := c.do(string(reqs[j][1]))
			if diffs := compareReply(t, string(wants[j]), got); len(diffs) > 0 {
				t.Errorf("README console session %d: %s\n  got  %s\n  want %s\n  %s", i, reqs[j][1], got, wants[j], strings.Join(diffs, "\n  "))
			}
		}
	}

	for _, tc := range []struct{ fence, interpreter, file, client, want string }{
		{"py", "python3", "example.py", pythonPackage, "released True"},
		{"mjs", "node", "example.mjs", nodePackage, "released true"},
	} {
		t.Run(tc.fence, func(t *testing.T) {
			// A sidecar of its own (its own key prefix): the console
			// sessions' takes on alice's bucket refill at 10 per second, and
			// 19 tokens left must not depend on how long ago they ran.
			sc := startSidecar(t, r.URL())
			out := runReadmeSnippet(t, readme, tc.fence, tc.interpreter, tc.file, tc.client, sc.socket)
			if !strings.Contains(out, "tokens left 19") || !strings.Contains(out, tc.want) {
				t.Fatalf("README %s example printed %q, want 19 tokens left and the lease released", tc.fence, out)
			}
			assertKeysHaveTTL(t, r, sc.prefix)
		})
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestCLIAlgorithms: the binary is its own client for every algorithm, and
// `quotad release` frees a lease.
func TestCLIAlgorithms(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	run := func(args ...string) reply {
		t.Helper()
		stdout, stderr, code := sc.cli(t, args[0], args[1:]...)
		if code != 0 {
			t.Fatalf("quotad %v: exit %d, stderr %q", args, code, stderr)
		}
		return mustParse(t, stdout)
	}
	bucket := []string{"--algorithm", "token_bucket", "--rate", "1", "--period-ms", "60000", "--burst", "2"}
	rep := run(append(append([]string{"take"}, bucket...), "--cost", "2", "alice")...)
	if !rep.flag(t, "allowed") || rep.num(t, "remaining") != 0 || rep.num(t, "limit") != 2 {
		t.Fatalf("token bucket take = %s", rep)
	}
	if rep := run(append(append([]string{"peek"}, bucket...), "alice")...); rep.num(t, "remaining") != 0 {
		t.Fatalf("token bucket peek = %s", rep)
	}
	jobs := []string{"--algorithm", "concurrency", "--limit", "1", "--lease-ms", "60000"}
	if rep := run(append(append([]string{"take"}, jobs...), "-r", "job-1", "alice")...); !rep.flag(t, "allowed") || rep.num(t, "lease_ms") != 60000 {
		t.Fatalf("lease = %s", rep)
	}
	stdout, _, code := sc.cli(t, "take", append(jobs, "-r", "job-2", "--exit-code", "alice")...)
	if code != 2 {
		t.Fatalf("second lease with --exit-code: exit %d (%s), want 2: denied", code, stdout)
	}
	if rep := run(append(append([]string{"release"}, jobs...), "-r", "job-1", "alice")...); !rep.flag(t, "released") {
		t.Fatalf("release = %s", rep)
	}
	if rep := run(append(append([]string{"release"}, jobs...), "-r", "job-1", "alice")...); rep.flag(t, "released") {
		t.Fatalf("second release = %s, want released false", rep)
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}
