package main

import (
	"strings"
	"testing"
)

func TestClientCommandsNeedASubjectAndASidecar(t *testing.T) {
	_, stderr, code := runCLI(t, "take", "--socket", "/nonexistent/q.sock", "--limit", "1", "--window-ms", "1000")
	if code != exitError || !strings.Contains(stderr, "subject") {
		t.Fatalf("take without subject: code %d, stderr %q", code, stderr)
	}
	_, stderr, code = runCLI(t, "ping", "--socket", "/nonexistent/q.sock")
	if code != exitError || !strings.Contains(stderr, "connect to quotad") {
		t.Fatalf("ping without sidecar: code %d, stderr %q", code, stderr)
	}
}

// Flags after the subject are not parsed; dropping them silently would turn
// a denial into exit 0 for `take ... subject --exit-code`.
func TestClientCommandsRefuseArgumentsAfterTheSubject(t *testing.T) {
	for _, args := range [][]string{
		{"take", "--limit", "1", "--window-ms", "1000", "bob", "--exit-code"},
		{"take", "--limit", "1", "--window-ms", "1000", "alice", "bob"},
		{"peek", "--subject", "alice", "--limit", "1", "--window-ms", "1000", "bob"},
	} {
		_, stderr, code := runCLI(t, append(args[:1:1], append([]string{"--socket", "/nonexistent/q.sock"}, args[1:]...)...)...)
		if code != exitError || !strings.Contains(stderr, "unexpected arguments") {
			t.Errorf("%v: code %d, stderr %q; want exit 1 naming the unexpected arguments", args, code, stderr)
		}
	}
}
