package sidecar

import (
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
)

// A settle through the socket: counted by op and result, answered in
// request order after its take on one connection, never degraded (a policy's
// on_unavailable is for takes), and safe to retry once Redis is back.
func TestSettleThroughTheSocket(t *testing.T) {
	cfg, err := policy.ParseConfig([]byte("policies:\n  llm:\n    limit: 10000\n    window: 1m\n    on_unavailable: allow\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := redistest.Start(t)
	ts := startServer(t, Options{Store: openStore(t, r.URL()), Config: cfg, AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)

	const at = `"subject":"t","policy":"llm","request_id":"call-1"`
	replies := c.sendBatch(`{"op":"take",`+at+`,"cost":2000}`, `{"op":"settle",`+at+`,"cost":1234}`, `{"op":"settle",`+at+`,"cost":1234}`,
		`{"op":"settle","subject":"t","policy":"llm","request_id":"never","cost":1}`)
	if got := decodeReply(t, replies[0]); !got.Allowed || got.Used != 2000 {
		t.Fatalf("take = %s", replies[0])
	}
	if got := decodeReply(t, replies[1]); !got.Settled || got.Replay || got.Reserved != 2000 || got.Used != 1234 || got.Remaining != 8766 {
		t.Fatalf("settle = %s", replies[1])
	}
	if got := decodeReply(t, replies[2]); !got.Settled || !got.Replay || got.Used != 1234 {
		t.Fatalf("settle again = %s", replies[2])
	}
	if got := decodeReply(t, replies[3]); !got.OK || got.Settled || got.Used != 1234 {
		t.Fatalf("settle of a take never accepted = %s", replies[3])
	}
	for result, want := range map[string]float64{"settled": 1, "replay": 1, "not_settled": 1} {
		if got := metricValue(t, ts.Server, "quotad_requests_total", map[string]string{"op": "settle", "result": result}); got != want {
			t.Errorf("quotad_requests_total{op=settle,result=%s} = %v, want %v", result, got, want)
		}
	}

	// A full Redis refuses the settle whole: UNAVAILABLE, not a degraded
	// answer, and nothing was written.
	if got := c.call(`{"op":"take","subject":"t","policy":"llm","request_id":"call-2","cost":100}`); !got.Allowed || got.Used != 1334 {
		t.Fatalf("take = %+v", got)
	}
	redisOK(t, r, "CONFIG", "SET", "maxmemory", "1")
	line := c.callRaw(`{"op":"settle","subject":"t","policy":"llm","request_id":"call-2","cost":0}`)
	if got := decodeReply(t, line); got.OK || got.Error != protocol.CodeUnavailable || strings.Contains(line, "degraded") {
		t.Fatalf("settle on a full Redis = %s, want UNAVAILABLE", line)
	}
	redisOK(t, r, "CONFIG", "SET", "maxmemory", "0")
	if got := c.call(`{"op":"settle","subject":"t","policy":"llm","request_id":"call-2","cost":0}`); !got.Settled || got.Replay || got.Used != 1234 {
		t.Fatalf("the settle retried once Redis has room = %+v, want applied once, used back to 1234", got)
	}
}
