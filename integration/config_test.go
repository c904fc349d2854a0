package integration_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// policyFile is the policy file of PROTOCOL.md's examples with the given
// limit for policy api.
func policyFile(limit int) string {
	return fmt.Sprintf("policies:\n  api:\n    limit: %d\n    window: 1m\n", limit)
}

// writeFileAtomically replaces path the way config management does: write a
// temporary file next to it, then rename it over the old one.
func writeFileAtomically(t *testing.T, path, contents string) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.WriteString(contents); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
}

// countLog counts log lines of the given level whose message contains msg.
func (p *sidecarProc) countLog(level, msg string) int {
	n := 0
	for _, l := range p.logLines() {
		if l.str("level") == level && strings.Contains(l.str("msg"), msg) {
			n++
		}
	}
	return n
}

func policyTake(subject string, extra ...any) map[string]any {
	return withFields(map[string]any{"op": "take", "subject": subject, "policy": "api"}, extra)
}

func policyPeek(subject string) map[string]any {
	return map[string]any{"op": "peek", "subject": subject, "policy": "api"}
}

// TestConfigPolicies uses named policies from a file: takes by name, an
// unknown name, a change picked up by polling that applies to the live
// window, a broken file that is ignored, and reload on SIGHUP.
func TestConfigPolicies(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "policies.yaml")
	writeFileAtomically(t, cfg, policyFile(3))
	sc := startSidecar(t, r.URL(), "--config", cfg, "--config-poll", "100ms")
	c := sc.dial(t)

	first := c.call(policyTake("user-1"))
	wantTake(t, first, true, false, 3, 1)
	wantResetWithin(t, first, 60000)
	wantTake(t, c.call(policyTake("user-1")), true, false, 3, 2)
	wantTake(t, c.call(policyTake("user-1")), true, false, 3, 3)
	wantTake(t, c.call(policyTake("user-1")), false, false, 3, 3)
	wantError(t, c.call(map[string]any{"op": "take", "subject": "user-1", "policy": "nope"}), "UNKNOWN_POLICY")
	wantError(t, c.call(map[string]any{"op": "peek", "subject": "user-1", "policy": "nope"}), "UNKNOWN_POLICY")
	wantError(t, c.call(policyTake("user-2", "cost", 4)), "INVALID") // above the policy's limit
	key := luascript.FixedWindowKey(sc.prefix, "api", "user-1")
	if got := redisString(t, r, "HGET", key, "used"); got != "3" {
		t.Fatalf("HGET %s used = %q, want 3", key, got)
	}

	// A new limit reaches the live window: 3 used of 5, and the window
	// keeps its end.
	writeFileAtomically(t, cfg, policyFile(5))
	eventually(t, "the poller to load limit 5", func() bool {
		return c.call(policyPeek("user-1")).num(t, "limit") == 5
	})
	wantPeek(t, c.call(policyPeek("user-1")), 5, 3)
	fourth := c.call(policyTake("user-1"))
	wantTake(t, fourth, true, false, 5, 4)
	if fourth.num(t, "reset_ms") > first.num(t, "reset_ms") {
		t.Fatalf("reset_ms %d after the reload, %d before: the window must keep its end", fourth.num(t, "reset_ms"), first.num(t, "reset_ms"))
	}
	sc.waitLog(t, "info", "config reloaded")

	// Broken files are logged and ignored; the config in use stays.
	writeFileAtomically(t, cfg, "policies:\n  api:\n    limit: 0\n    window: 1m\n")
	eventually(t, "a config reload failure for limit 0", func() bool {
		return sc.countLog("error", "config reload failed") == 1
	})
	writeFileAtomically(t, cfg, "policies:\n  api:\n    limt: 9\n    window: 1m\n")
	eventually(t, "a config reload failure for a misspelt field", func() bool {
		return sc.countLog("error", "config reload failed") == 2
	})
	writeFileAtomically(t, cfg, "policies: [api\n")
	eventually(t, "a config reload failure for broken YAML", func() bool {
		return sc.countLog("error", "config reload failed") == 3
	})
	wantPeek(t, c.call(policyPeek("user-1")), 5, 4)
	wantTake(t, c.call(policyTake("user-1")), true, false, 5, 5)
	if err := sc.pingReady(); err != nil {
		t.Fatalf("after broken config files: %v", err)
	}

	t.Run("SIGHUP reloads", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "policies.yaml")
		writeFileAtomically(t, cfg, policyFile(3))
		// Polling every hour: only the signal can load the new file in time.
		hup := startSidecar(t, r.URL(), "--config", cfg, "--config-poll", "1h")
		c := hup.dial(t)
		wantTake(t, c.call(policyTake("user-1")), true, false, 3, 1)
		writeFileAtomically(t, cfg, policyFile(7))
		hup.signal(t, syscall.SIGHUP)
		eventually(t, "SIGHUP to load limit 7", func() bool {
			return c.call(policyPeek("user-1")).num(t, "limit") == 7
		})
		wantTake(t, c.call(policyTake("user-1")), true, false, 7, 2)
		if err := hup.pingReady(); err != nil {
			t.Fatalf("after SIGHUP: %v", err)
		}
		assertKeysHaveTTL(t, r, hup.prefix)
	})

	t.Run("inline limits disabled", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "policies.yaml")
		writeFileAtomically(t, cfg, policyFile(5))
		strict := startSidecar(t, r.URL(), "--config", cfg, "--allow-inline=false")
		c := strict.dial(t)
		wantError(t, c.call(takeReq("user-1", 5, 60000)), "INVALID")
		wantError(t, c.call(peekReq("user-1", 5, 60000)), "INVALID")
		wantTake(t, c.call(policyTake("user-1")), true, false, 5, 1)
		if keys := scanKeys(t, r, strict.prefix); len(keys) != 1 || keys[0] != luascript.FixedWindowKey(strict.prefix, "api", "user-1") {
			t.Fatalf("keys %q: want only the named policy's window", keys)
		}
		assertKeysHaveTTL(t, r, strict.prefix)
	})

	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestPolicyRequestIDCap: a policy's max_request_ids bounds the request ids a
// window remembers. A new id past the cap is refused with REQUEST_IDS_FULL and
// consumes nothing; replays and takes without an id still work.
func TestPolicyRequestIDCap(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "policies.yaml")
	writeFileAtomically(t, cfg, "policies:\n  capped:\n    limit: 10\n    window: 1m\n    max_request_ids: 2\n")
	sc := startSidecar(t, r.URL(), "--config", cfg)
	c := sc.dial(t)
	take := func(extra ...any) reply {
		return c.call(withFields(map[string]any{"op": "take", "subject": "u", "policy": "capped"}, extra))
	}

	wantTake(t, take("request_id", "a"), true, false, 10, 1)
	wantTake(t, take("request_id", "b"), true, false, 10, 2)
	wantError(t, take("request_id", "c"), "REQUEST_IDS_FULL")
	wantTake(t, take("request_id", "a"), true, true, 10, 1)
	wantTake(t, take(), true, false, 10, 3)
	key := luascript.FixedWindowKey(sc.prefix, "capped", "u")
	if got := redisString(t, r, "HGET", key, "used"); got != "3" {
		t.Fatalf("HGET %s used = %q, want 3: the refused id consumed nothing", key, got)
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}
