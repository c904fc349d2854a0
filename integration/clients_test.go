package integration_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
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
