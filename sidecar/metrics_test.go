package sidecar

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/dispatch"
	"quotad/integration/redistest"
	"quotad/luascript"
	"quotad/policy"
)

// metricValue is the value of the series of name with exactly these labels,
// 0 when there is none.
func metricValue(t *testing.T, s *Server, name string, labels map[string]string) float64 {
	t.Helper()
	// The sum over every series whose labels include labels: a label the
	// caller leaves out is summed over.
	var sum float64
	for _, mf := range gather(t, s) {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got, ok := have[k]; !ok || got != v {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func gather(t *testing.T, s *Server) []*dto.MetricFamily {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	return mfs
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

func TestMetricsCountDecisionsByPolicyAndResultNeverBySubject(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	cfg, err := policy.ParseConfig([]byte("policies:\n  api:\n    limit: 1\n    window: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Store: st, Config: cfg, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)

	// A key left without a TTL, which the first take heals.
	rc := r.Client(t)
	if err := rc.Do(context.Background(), rc.B().Hset().Key(testPrefix+"fw:{p:api:subject-healed}").FieldValue().FieldValue("used", "0").FieldValue("policy", "1:60000").FieldValue("ids", "0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`{"op":"take","subject":"subject-healed","policy":"api"}`,             // allowed
		`{"op":"take","subject":"subject-a","policy":"api","request_id":"x"}`, // allowed
		`{"op":"take","subject":"subject-a","policy":"api","request_id":"x"}`, // replay
		`{"op":"take","subject":"subject-a","policy":"api"}`,                  // denied
		`{"op":"take","subject":"subject-b","policy":"random-name-1"}`,        // UNKNOWN_POLICY
		`{"op":"take","subject":"subject-c","limit":5,"window_ms":60000}`,     // inline, allowed
		`{"op":"take","subject":"subject-c","limit":6,"window_ms":60000}`,     // inline, POLICY
		`{"op":"peek","subject":"subject-a","policy":"api"}`,                  // not a decision
		`{"op":"take","subject":"subject-d","policy":"api","cost":2}`,         // INVALID (cost > limit)
	} {
		if got := c.call(line); got.Error == "INTERNAL" {
			t.Fatalf("%s: %+v", line, got)
		}
	}
	for _, tc := range []struct {
		policy, result string
		want           float64
	}{
		{"api", "allowed", 2},
		{"api", "replay", 1},
		{"api", "denied", 1},
		{"api", "INVALID", 1},
		{"", "UNKNOWN_POLICY", 1},
		{"", "allowed", 1},
		{"", "POLICY", 1},
	} {
		if got := metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": tc.policy, "result": tc.result}); got != tc.want {
			t.Errorf("decisions{policy=%q,result=%q} = %v, want %v", tc.policy, tc.result, got, tc.want)
		}
	}
	if got := metricValue(t, ts.Server, "quotad_request_duration_seconds", map[string]string{"op": "take"}); got != 8 {
		t.Errorf("take latency observations = %v, want 8", got)
	}
	if got := metricValue(t, ts.Server, "quotad_request_duration_seconds", map[string]string{"op": "peek"}); got != 1 {
		t.Errorf("peek latency observations = %v, want 1", got)
	}
	if got := metricValue(t, ts.Server, "quotad_healed_keys_total", nil); got != 1 {
		t.Errorf("healed keys = %v, want 1", got)
	}
	if got := metricValue(t, ts.Server, "quotad_redis_call_duration_seconds", nil); got < 6 {
		t.Errorf("redis calls observed = %v, want one per take or peek that reached redis (6 or more)", got)
	}
	if got := metricValue(t, ts.Server, "quotad_connections", nil); got != 1 {
		t.Errorf("open connections = %v, want 1", got)
	}
	if got := metricValue(t, ts.Server, "quotad_redis_up", nil); got != 1 {
		t.Errorf("redis up = %v, want 1", got)
	}
	if got := metricValue(t, ts.Server, "quotad_inflight_requests", nil); got != 0 {
		t.Errorf("in flight after every reply = %v, want 0", got)
	}
	for _, mf := range gather(t, ts.Server) {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.Contains(lp.GetValue(), "subject-") || strings.Contains(lp.GetValue(), "random-name") {
					t.Errorf("%s has label %s=%q: subjects and unknown policy names must never be label values", mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}

	code, body := get(t, ts.HTTPHandler(), "/metrics")
	if code != http.StatusOK || !strings.Contains(body, `quotad_decisions_total{algorithm="fixed_window",policy="api",result="denied"} 1`) || !strings.Contains(body, "process_resident_memory_bytes") {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
}

func TestRedisTimeoutsAreCountedAndInflightShows(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	pauseWrites(t, r)
	c.send(inlineTake("1", "slow", 5, `,"timeout_ms":300`))
	waitFor(t, "the paused take to show in flight", func() bool {
		return metricValue(t, ts.Server, "quotad_inflight_requests", nil) == 1
	})
	checkCode(t, "paused take", c.recv(), "UNAVAILABLE")
	if got := metricValue(t, ts.Server, "quotad_redis_errors_total", map[string]string{"kind": "timeout"}); got != 1 {
		t.Fatalf("redis timeouts = %v, want 1", got)
	}
	if got := metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": "", "result": "UNAVAILABLE"}); got != 1 {
		t.Fatalf("UNAVAILABLE decisions = %v, want 1", got)
	}
}

func TestConfigReloadsAreCounted(t *testing.T) {
	s := NewServer(Options{})
	defer s.Close()
	// The Reloader (tested in package policy) reports each reload here.
	s.Reloaded(errors.New("policy \"api\": limit: must be an integer"))
	s.Reloaded(nil)
	if ok, failed := metricValue(t, s, "quotad_config_reloads_total", map[string]string{"result": "ok"}),
		metricValue(t, s, "quotad_config_reloads_total", map[string]string{"result": "failed"}); ok != 1 || failed != 1 {
		t.Fatalf("reloads ok %v, failed %v; want 1 and 1", ok, failed)
	}
}

func TestDecisionLog(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	cfg, err := policy.ParseConfig([]byte("policies:\n  api:\n    limit: 1\n    window: 1m\n  trial:\n    limit: 1\n    window: 1m\n    mode: shadow\n"))
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{
		`{"op":"take","subject":"alice","policy":"api","cost":1,"request_id":"r1"}`, // allowed
		`{"op":"take","subject":"alice","policy":"api"}`,                            // denied
		`{"op":"take","subject":"bob","policy":"trial"}`,                            // shadow_allowed
		`{"op":"take","subject":"bob","policy":"trial"}`,                            // shadow_denied
		`{"op":"take","subject":"carol","policy":"nope"}`,                           // UNKNOWN_POLICY
	}
	for _, tc := range []struct {
		level    string
		verdicts []string
	}{
		{dispatch.LogDecisionsNone, nil},
		{dispatch.LogDecisionsDenied, []string{"denied", "shadow_denied"}},
		{dispatch.LogDecisionsAll, []string{"allowed", "denied", "shadow_allowed", "shadow_denied", "UNKNOWN_POLICY"}},
	} {
		t.Run(tc.level, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			ts := startServer(t, Options{Store: st, Config: cfg, LogDecisions: tc.level, Logger: zap.New(core), KeyPrefix: "dl-" + tc.level + ":"})
			c := ts.dial(t)
			waitRedisOK(t, c)
			for _, l := range lines {
				c.call(l)
			}
			got := logs.FilterLoggerName("decision").AllUntimed()
			if len(got) != len(tc.verdicts) {
				t.Fatalf("%d decision lines, want %d: %v", len(got), len(tc.verdicts), got)
			}
			for i, e := range got {
				f := e.ContextMap()
				if e.Message != "decision" || f["verdict"] != tc.verdicts[i] {
					t.Errorf("line %d: %q %v, want verdict %s", i, e.Message, f, tc.verdicts[i])
				}
				for _, k := range []string{"policy", "subject", "cost", "latency_us", "op", "algorithm"} {
					if _, ok := f[k]; !ok {
						t.Errorf("line %d: no %q in %v", i, k, f)
					}
				}
				isError := strings.ToUpper(tc.verdicts[i]) == tc.verdicts[i]
				if _, ok := f["used"]; ok == isError {
					t.Errorf("line %d: used present %v; want it on verdicts, not on errors: %v", i, ok, f)
				}
			}
			if tc.level == dispatch.LogDecisionsAll {
				if f := got[0].ContextMap(); f["subject"] != "alice" || f["policy"] != "api" || f["cost"] != int64(1) || f["used"] != int64(1) || f["request_id"] != "r1" {
					t.Errorf("first line fields %v", f)
				}
			}
		})
	}
}

func TestListenHTTPServesAndRefusesATakenPort(t *testing.T) {
	s := NewServer(Options{})
	defer s.Close()
	hs, err := ListenHTTP("127.0.0.1:0", s)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + hs.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "quotad_build_info") {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, body)
	}
	if _, err := ListenHTTP(hs.Addr(), s); err == nil || !strings.Contains(err.Error(), "--http-addr") {
		t.Fatalf("second listener on %s: %v, want an error naming --http-addr", hs.Addr(), err)
	}
	if err := hs.Close(); err != nil {
		t.Fatal(err)
	}
}

func scriptSHAs() []string {
	var shas []string
	for _, src := range luascript.Sources() {
		sum := sha1.Sum([]byte(src))
		shas = append(shas, hex.EncodeToString(sum[:]))
	}
	return shas
}

// --log-decisions denied logs a degraded denial (on_unavailable: deny), not
// a degraded allow.
func TestDecisionLogDeniedIncludesDegradedDenials(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	cfg, err := policy.ParseConfig([]byte("policies:\n  open:\n    limit: 5\n    window: 1m\n    on_unavailable: allow\n  closed:\n    limit: 5\n    window: 1m\n    on_unavailable: deny\n"))
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	ts := startServer(t, Options{Store: st, Config: cfg, LogDecisions: dispatch.LogDecisionsDenied, Logger: zap.New(core)})
	c := ts.dial(t)
	waitRedisOK(t, c)
	// A full Redis refuses the takes' writes: both are answered degraded.
	redisOK(t, r, "CONFIG", "SET", "maxmemory", "1")
	if got := c.call(`{"op":"take","subject":"s","policy":"open"}`); !got.Degraded || !got.Allowed {
		t.Fatalf("take of open = %+v, want a degraded allow", got)
	}
	if got := c.call(`{"op":"take","subject":"s","policy":"closed"}`); !got.Degraded || got.Allowed {
		t.Fatalf("take of closed = %+v, want a degraded denial", got)
	}
	got := logs.FilterLoggerName("decision").AllUntimed()
	if len(got) != 1 || got[0].ContextMap()["policy"] != "closed" || got[0].ContextMap()["verdict"] != "degraded" {
		t.Fatalf("decision lines %v, want one, the degraded denial of closed", got)
	}
}
