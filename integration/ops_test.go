package integration_test

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// freeAddr is a loopback address nobody listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// What the Kubernetes example relies on: `quotad ping` as the exec probe,
// --http-addr for Prometheus and /readyz, a shadow policy, and the decision
// log, all on the real binary.
func TestOperatingTheSidecar(t *testing.T) {
	r := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(cfg, []byte("policies:\n  api:\n    limit: 1\n    window: 1m\n  trial:\n    limit: 1\n    window: 1m\n    mode: shadow\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startSidecar(t, r.URL(), "--config", cfg, "--http-addr", addr, "--log-decisions", "denied")

	var out, stderr string
	var code int
	eventually(t, "quotad ping to exit 0", func() bool {
		out, stderr, code = p.cli(t, "ping")
		return code == 0
	})
	if !strings.Contains(out, `"ready":true`) {
		t.Fatalf("ping exit 0 with %s", out)
	}
	if code, body := httpGet(t, "http://"+addr+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	if code, body := httpGet(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	if code, body := httpGet(t, "http://"+addr+"/redisz"); code != http.StatusOK {
		t.Fatalf("/redisz: %d %s", code, body)
	}
	if out, stderr, code := p.cli(t, "ping", "--redis"); code != 0 {
		t.Fatalf("ping --redis with redis up: exit %d, stdout %q, stderr %q", code, out, stderr)
	}

	c := p.dial(t)
	wantTake(t, c.do(`{"op":"take","subject":"alice","policy":"api"}`), true, false, 1, 1)
	wantTake(t, c.do(`{"op":"take","subject":"alice","policy":"api"}`), false, false, 1, 1)
	c.do(`{"op":"take","subject":"alice","policy":"trial"}`)
	shadow := c.do(`{"op":"take","subject":"alice","policy":"trial"}`)
	if !shadow.flag(t, "allowed") || !shadow.flag(t, "shadow") || shadow.flag(t, "shadow_allowed") {
		t.Fatalf("second shadow take = %s: want allowed, shadow, shadow_allowed false", shadow)
	}

	_, body := httpGet(t, "http://"+addr+"/metrics")
	for _, want := range []string{
		`quotad_decisions_total{algorithm="fixed_window",policy="api",result="allowed"} 1`,
		`quotad_decisions_total{algorithm="fixed_window",policy="api",result="denied"} 1`,
		`quotad_decisions_total{algorithm="fixed_window",policy="trial",result="shadow_denied"} 1`,
		`quotad_redis_up 1`,
		`quotad_build_info{version=`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "alice") {
		t.Error("/metrics names a subject")
	}

	line := p.waitLog(t, "info", "decision")
	if line.str("logger") != "decision" || line.str("subject") != "alice" || line.str("policy") != "api" || line.str("verdict") != "denied" {
		t.Fatalf("decision log line %v", line)
	}
	for _, l := range p.logLines() {
		if l.str("msg") == "decision" && l.str("verdict") == "allowed" {
			t.Fatalf("--log-decisions denied logged an allowed take: %v", l)
		}
	}

	// Redis unreachable: the sidecar answers and stays ready (taking the
	// pod out of its Service would not bring Redis back); only --redis and
	// /redisz report the outage.
	downHTTP := freeAddr(t)
	down := launchSidecar(t, socketPath(t), "redis://"+freeAddr(t), "--http-addr", downHTTP)
	eventually(t, "the sidecar without redis to answer a ping", func() bool {
		out, stderr, code = down.cli(t, "ping")
		return strings.Contains(out, `"ok":true`)
	})
	if code != 0 || !strings.Contains(out, `"ready":true`) || !strings.Contains(out, `"redis_ok":false`) {
		t.Fatalf("ping with redis down: exit %d, stdout %q, stderr %q; want exit 0, ready true, redis_ok false", code, out, stderr)
	}
	if out, stderr, code = down.cli(t, "ping", "--redis"); code != 1 || !strings.Contains(stderr, "Redis does not") {
		t.Fatalf("ping --redis with redis down: exit %d, stdout %q, stderr %q; want exit 1 saying Redis does not answer", code, out, stderr)
	}
	if code, body := httpGet(t, "http://"+downHTTP+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with redis down: %d %s; want 200", code, body)
	}
	if code, body := httpGet(t, "http://"+downHTTP+"/redisz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "redis") {
		t.Fatalf("/redisz with redis down: %d %s; want 503 and why", code, body)
	}
}
