package sidecar

import (
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

const batchConfig = `
policies:
  api:
    limit: 2
    window: 1m
  trial:
    limit: 2
    window: 1m
    mode: shadow
  open:
    limit: 5
    window: 1m
    on_unavailable: allow
  closed:
    limit: 5
    window: 1m
    on_unavailable: deny
  bucket:
    algorithm: token_bucket
    rate: 10
    period: 1s
`

func startBatchServer(t *testing.T) (*testServer, *client, *redistest.Server, *store.Store) {
	t.Helper()
	cfg, err := policy.ParseConfig([]byte(batchConfig))
	if err != nil {
		t.Fatal(err)
	}
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st, Config: cfg, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	return ts, c, r, st
}

// sendBatch writes lines in one write, so the reader finds them buffered
// together, and returns the raw replies in order.
func (c *client) sendBatch(lines ...string) []string {
	c.t.Helper()
	c.send(lines...)
	var out []string
	for _, l := range lines {
		if isBlank([]byte(l)) {
			continue
		}
		out = append(out, c.recvRaw())
	}
	return out
}

// Lines read together are answered in order, whatever path each takes:
// takes and peeks batched for Redis, pings, bad lines, unknown policies,
// token buckets, requests with their own timeout, and blank lines (no
// reply). Every take ran once, and metrics count each request once.
func TestBatchAnswersMixedLinesInOrder(t *testing.T) {
	ts, c, r, _ := startBatchServer(t)
	lines := []string{
		`{"op":"take","id":1,"subject":"a","policy":"api"}`,
		`{"op":"peek","id":2,"subject":"a","policy":"api"}`,
		`{"op":"ping","id":3}`,
		`{"op":"take","id":4,"subject":"a","policy":"api","request_id":"r1"}`,
		`not json`,
		`{"op":"take","id":6,"subject":"a","policy":"api"}`,
		``,
		`{"op":"take","id":7,"subject":"a","policy":"nope"}`,
		`{"op":"take","id":8,"subject":"b","policy":"bucket"}`,
		`{"op":"take","id":9,"subject":"e","limit":5,"window_ms":60000,"timeout_ms":500}`,
		`{"op":"take","id":10,"subject":"c","limit":5,"window_ms":60000,"cost":2}`,
		`{"op":"take","id":11,"subject":"d","policy":"api","cost":3}`,
		`{"op":"take","id":12,"subject":"a","policy":"api","request_id":"r1"}`,
		`{"op":"peek","id":13,"subject":"c","limit":5,"window_ms":60000}`,
	}
	before := ts.batched(t)
	got := c.sendBatch(lines...)
	type want struct {
		id      string
		code    protocol.Code
		allowed bool
		used    int64
	}
	wants := []want{
		{id: "1", allowed: true, used: 1},
		{id: "2", used: 1}, // a peek in the same batch sees the take before it
		{id: "3"},
		{id: "4", allowed: true, used: 2},
		{code: protocol.CodeInvalid},
		{id: "6", used: 2}, // denied
		{id: "7", code: protocol.CodeUnknownPolicy},
		{id: "8", allowed: true, used: 1},
		{id: "9", allowed: true, used: 1},
		{id: "10", allowed: true, used: 2},
		{id: "11", code: protocol.CodeInvalid},
		{id: "12", allowed: true, used: 2}, // a replay
		{id: "13", used: 2},
	}
	if len(got) != len(wants) {
		t.Fatalf("%d replies, want %d", len(got), len(wants))
	}
	for i, w := range wants {
		rep := decodeReply(t, got[i])
		if string(rep.ID) != w.id && !(w.id == "" && rep.ID == nil) {
			t.Fatalf("reply %d = %s, want id %s: replies out of order", i, got[i], w.id)
		}
		if w.code != "" {
			checkCode(t, "reply "+strconv.Itoa(i), rep, w.code)
			continue
		}
		if !rep.OK || rep.Allowed != w.allowed || rep.Used != w.used {
			t.Errorf("reply %d = %s, want allowed %v, used %d", i, got[i], w.allowed, w.used)
		}
	}
	if rep := decodeReply(t, got[11]); !rep.Replay {
		t.Errorf("reply to id 12 = %s, want a replay", got[11])
	}
	// Takes 1, 4, 6, 8 (a token bucket), 10, 12 and peeks 2, 13 went to
	// Redis in batches; 9 has its own timeout, so it went alone and may run
	// before or after them (hence another subject).
	if n := ts.batched(t) - before; n != 8 {
		t.Errorf("%d requests answered through batches, want 8", n)
	}
	// Redis holds what the replies say: each take applied once.
	rc := r.Client(t)
	for key, want := range map[string]string{testPrefix + "fw:{p:api:a}": "2", testPrefix + "fw:{i:c}": "2"} {
		used, err := rc.Do(t.Context(), rc.B().Hget().Key(key).Field("used").Build()).ToString()
		if err != nil || used != want {
			t.Errorf("used of %s = %q, %v; want %s", key, used, err, want)
		}
	}
	for _, tc := range []struct {
		policy, result string
		want           float64
	}{
		{"api", "allowed", 2},
		{"api", "denied", 1},
		{"api", "replay", 1},
		{"api", "INVALID", 1},
		{"", "UNKNOWN_POLICY", 1},
		{"bucket", "allowed", 1},
		{"", "allowed", 2},
	} {
		if got := metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": tc.policy, "result": tc.result}); got != tc.want {
			t.Errorf("decisions{policy=%q,result=%q} = %v, want %v", tc.policy, tc.result, got, tc.want)
		}
	}
	for op, want := range map[string]float64{"take": 9, "peek": 2} {
		if got := metricValue(t, ts.Server, "quotad_request_duration_seconds", map[string]string{"op": op}); got != want {
			t.Errorf("%s latency observations = %v, want %v", op, got, want)
		}
	}
	if got := metricValue(t, ts.Server, "quotad_inflight_requests", nil); got != 0 {
		t.Errorf("in flight after every reply = %v, want 0", got)
	}
}

// A shadow policy's takes in a batch are allowed and carry the verdict
// enforcement would give, as alone.
func TestBatchShadow(t *testing.T) {
	ts, c, _, _ := startBatchServer(t)
	var lines []string
	for i := range 3 {
		lines = append(lines, `{"op":"take","id":`+strconv.Itoa(i)+`,"subject":"s","policy":"trial"}`)
	}
	got := c.sendBatch(lines...)
	for i, shadowAllowed := range []bool{true, true, false} {
		rep := decodeReply(t, got[i])
		if !rep.OK || !rep.Allowed || !rep.Shadow || rep.ShadowAllowed != shadowAllowed || rep.RetryAfterMS != 0 {
			t.Errorf("shadow take %d = %s, want allowed, shadow_allowed %v", i, got[i], shadowAllowed)
		}
	}
	if n := metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": "trial", "result": "shadow_denied"}); n != 1 {
		t.Errorf("shadow_denied count = %v, want 1", n)
	}
	if ts.batched(t) == 0 {
		t.Error("no request went through a batch")
	}
}

// A window a batch found exhausted is denied from memory in the next
// batch, without calling Redis.
func TestBatchLocalDeny(t *testing.T) {
	_, c, r, _ := startBatchServer(t)
	take := `{"op":"take","subject":"hot","policy":"api"}`
	got := c.sendBatch(take, take, take)
	for i, allowed := range []bool{true, true, false} {
		if rep := decodeReply(t, got[i]); !rep.OK || rep.Allowed != allowed {
			t.Fatalf("take %d = %s, want allowed %v", i, got[i], allowed)
		}
	}
	r.ResetStats(t)
	got = c.sendBatch(take, take, take, take)
	for i, raw := range got {
		if rep := decodeReply(t, raw); !rep.OK || rep.Allowed || rep.Used != 2 || rep.RetryAfterMS <= 0 {
			t.Fatalf("take %d on the exhausted window = %s, want denied, used 2", i, raw)
		}
	}
	if n := r.ScriptCalls(t); n != 0 {
		t.Errorf("%d script calls for takes on a window known to be exhausted, want 0", n)
	}
}

// When Redis cannot decide, a batch's takes answer per their policy's
// on_unavailable, as alone: whether the calls reached Redis and were
// refused (out of memory) or never left (breaker open).
func TestBatchRedisUnavailable(t *testing.T) {
	ts, c, r, st := startBatchServer(t)
	lines := []string{
		`{"op":"take","id":1,"subject":"s","policy":"open"}`,
		`{"op":"take","id":2,"subject":"s","policy":"closed"}`,
		`{"op":"take","id":3,"subject":"s","policy":"api"}`,
		`{"op":"take","id":4,"subject":"s","limit":5,"window_ms":60000}`,
		`{"op":"ping","id":5}`,
		`{"op":"peek","id":6,"subject":"s","policy":"open"}`,
	}
	for _, o := range []struct {
		name   string
		start  func()
		peekOK bool
	}{
		{"refused: out of memory", func() { redisOK(t, r, "CONFIG", "SET", "maxmemory", "1") }, true},
		{"breaker open: Redis stopped", func() {
			r.Stop(t)
			waitFor(t, "the breaker to open", func() bool { return !st.Up() })
		}, false},
	} {
		o.start()
		got := c.sendBatch(lines...)
		checkDegraded(t, o.name+", allow", got[0], true)
		checkDegraded(t, o.name+", deny", got[1], false)
		checkCode(t, o.name+", error", decodeReply(t, got[2]), protocol.CodeUnavailable)
		checkCode(t, o.name+", inline", decodeReply(t, got[3]), protocol.CodeUnavailable)
		if rep := decodeReply(t, got[4]); !rep.OK || string(rep.ID) != "5" {
			t.Fatalf("%s, ping = %s", o.name, got[4])
		}
		rep := decodeReply(t, got[5])
		if o.peekOK {
			if !rep.OK || rep.Used != 0 || string(rep.ID) != "6" {
				t.Fatalf("%s, peek = %s, want the real usage, 0", o.name, got[5])
			}
		} else {
			checkCode(t, o.name+", peek", rep, protocol.CodeUnavailable)
		}
		if !strings.Contains(got[2], "outcome is unknown") && o.peekOK {
			// Refused before writing: the outcome is known.
			if !strings.Contains(got[2], "nothing was written") {
				t.Errorf("%s, error = %s", o.name, got[2])
			}
		}
	}
	if n := metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": "open", "result": "degraded"}); n != 2 {
		t.Errorf("degraded decisions of open = %v, want 2", n)
	}
	if ts.batched(t) == 0 {
		t.Error("no request went through a batch")
	}
}
