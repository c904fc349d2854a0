package main

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	defer func(c string) { commit = c }(commit)
	commit = "abc1234"
	out, _, code := runCLI(t, "version")
	want := "quotad " + version + " (commit abc1234, " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if code != exitOK || out != want {
		t.Fatalf("version: code %d, out %q; want %q", code, out, want)
	}
	out, _, code = runCLI(t, "version", "--json")
	var b buildInfo
	if err := json.Unmarshal([]byte(out), &b); err != nil || code != exitOK {
		t.Fatalf("version --json: code %d, %v, out %q", code, err, out)
	}
	if b != (buildInfo{Version: version, Commit: "abc1234", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}) {
		t.Fatalf("version --json = %+v", b)
	}
	out, _, code = runCLI(t, "--version")
	if code != exitOK || !strings.Contains(out, "commit abc1234") {
		t.Fatalf("--version: code %d, out %q; want the commit", code, out)
	}
	// Unstamped, the commit comes from the build's VCS information, which a
	// test binary does not have.
	commit = ""
	out, _, _ = runCLI(t, "version", "--json")
	if err := json.Unmarshal([]byte(out), &b); err != nil || b.Commit != "unknown" {
		t.Fatalf("unstamped version --json = %q (%v); want commit unknown", out, err)
	}
}
