package integration_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// TestNonGoClients runs the demos of the copyable Python and Node clients
// against a real sidecar; each checks its own scenario (take, replay,
// denial, CONFLICT, a pipelined batch) and exits 0 when it holds.
func TestNonGoClients(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())

	for _, tc := range []struct{ name, interpreter, script string }{
		{"python", "python3", filepath.Join("integration", "clients", "python", "demo.py")},
		{"node", "node", filepath.Join("integration", "clients", "node", "demo.mjs")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin, err := exec.LookPath(tc.interpreter)
			if err != nil {
				t.Fatalf("%s is required for the %s client's test and is not on PATH: %v", tc.interpreter, tc.name, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tc.script, sc.socket, "demo-"+tc.name)
			cmd.Dir = moduleRoot
			cmd.Env = cleanEnv()
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s %s: %v (timed out: %v)\n%s", tc.interpreter, tc.script, err, ctx.Err() != nil, out.String())
			}
		})
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestReadmeExamples runs the Python and Node snippets of README.md as a
// newcomer would paste them: next to a copy of the client, with the sidecar's
// socket at ./quotad.sock.
func TestReadmeExamples(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	readme, err := os.ReadFile(filepath.Join(moduleRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ fence, interpreter, file, client string }{
		{"python", "python3", "example.py", filepath.Join("integration", "clients", "python", "quotad.py")},
		{"js", "node", "example.mjs", filepath.Join("integration", "clients", "node", "quotad.mjs")},
	} {
		t.Run(tc.fence, func(t *testing.T) {
			out := runReadmeSnippet(t, readme, tc.fence, tc.interpreter, tc.file, tc.client, sc.socket)
			if !strings.Contains(out, "used 2 of 5") || !strings.Contains(out, "allowed") {
				t.Fatalf("README %s example printed %q, want the take's usage and the batch count", tc.fence, out)
			}
		})
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}

// runReadmeSnippet runs the README's ```fence example with interpreter, in
// a folder holding it as file, the client library at client (a path from
// the module root) and quotad.sock linked to socket, and returns what it
// printed.
func runReadmeSnippet(t *testing.T, readme []byte, fence, interpreter, file, client, socket string) string {
	t.Helper()
	m := regexp.MustCompile("(?s)```" + fence + "\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatalf("README.md has no ```%s example", fence)
	}
	dir := t.TempDir()
	lib, err := os.ReadFile(filepath.Join(moduleRoot, client))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{file: m[1], filepath.Base(client): lib} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(socket, filepath.Join(dir, "quotad.sock")); err != nil {
		t.Fatal(err)
	}
	bin, err := exec.LookPath(interpreter)
	if err != nil {
		t.Fatalf("%s is required for the README's example and is not on PATH: %v", interpreter, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, file)
	cmd.Dir = dir
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("README %s example: %v\n%s", fence, err, out)
	}
	return string(out)
}
