package integration_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"quotad/integration/redistest"
)

// `quotad serve --rls-socket` answers Envoy's generated client on its
// Unix socket (with the JSON socket's file mode), shares a quotad
// policy's window with the JSON socket, and drains on SIGTERM.
func TestRLSServe(t *testing.T) {
	r := redistest.Start(t)
	dir := t.TempDir()
	desc := filepath.Join(dir, "edge.yaml")
	pol := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(desc, []byte(`domain: edge
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: app
    rate_limit: {quotad_policy: api}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pol, []byte("policies:\n  api:\n    limit: 3\n    window: 24h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rlsSock := filepath.Join(filepath.Dir(socketPath(t)), "rls.sock")
	p := startSidecar(t, r.URL(), "--config", pol, "--rls-socket", rlsSock, "--rls-config", desc, "--socket-mode", "0600")
	fi, err := os.Stat(rlsSock)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("rls socket %v, %v: want a socket of mode 0600", fi, err)
	}
	conn, err := grpc.NewClient("unix://"+rlsSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v; want SERVING", h, err)
	}
	call := func(k, v string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}},
		}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp.GetOverallCode()
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := call("user", "u"); got != want {
			t.Fatalf("call %d: %v, want %v", i+1, got, want)
		}
	}
	// The app's take on the JSON socket and Envoy's calls count together.
	c := p.dial(t)
	c.send(`{"op":"take","policy":"api","subject":"shop","cost":2}`)
	if rep := c.read(); !rep.ok() || rep.num(t, "remaining") != 1 {
		t.Fatalf("socket take: %s", rep)
	}
	if call("app", "shop") != rlsv3.RateLimitResponse_OK || call("app", "shop") != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatal("the policy's window is not the socket's")
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	if _, err := os.Stat(rlsSock); !os.IsNotExist(err) {
		t.Errorf("rls socket after exit: %v, want it removed", err)
	}
	if !strings.Contains(p.out.String(), "serving envoy's rate limit service") {
		t.Errorf("log lacks the service's start:\n%s", p.out.String())
	}
}
