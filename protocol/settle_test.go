package protocol_test

import (
	"errors"
	"strings"
	"testing"

	"quotad/protocol"
)

func TestDecodeSettle(t *testing.T) {
	valid := []struct {
		line string
		cost int64
	}{
		{`{"op":"settle","subject":"u","policy":"api","request_id":"r-1","cost":1234}`, 1234},
		{`{"op":"settle","subject":"u","limit":5,"window_ms":1000,"request_id":"r-1","cost":0}`, 0},
		{`{"op":"settle","subject":"u","limit":5,"window_ms":1000,"request_id":"r-1","cost":1000000000,"headers":true}`, 1_000_000_000},
		{`{"op":"settle","subject":"u","algorithm":"token_bucket","rate":1,"period_ms":1000,"request_id":"r","cost":9}`, 9},
	}
	for _, tc := range valid {
		var r protocol.Request
		if err := protocol.Decode([]byte(tc.line), &r); err != nil {
			t.Errorf("Decode(%s): %v", tc.line, err)
			continue
		}
		if r.Op != protocol.OpSettle || r.Op.String() != "settle" || r.Cost != tc.cost || r.RequestID == "" {
			t.Errorf("Decode(%s) = op %v, cost %d, request_id %q", tc.line, r.Op, r.Cost, r.RequestID)
		}
	}

	invalid := []struct {
		line, msg string
	}{
		{`{"op":"settle","subject":"u","policy":"api","cost":1}`, "request_id"},
		{`{"op":"settle","subject":"u","policy":"api","request_id":"a b","cost":1}`, "request_id"},
		{`{"op":"settle","subject":"u","policy":"api","request_id":"r"}`, "cost"},
		{`{"op":"settle","subject":"u","policy":"api","request_id":"r","cost":null}`, "cost"},
		{`{"op":"settle","subject":"u","policy":"api","request_id":"r","cost":-1}`, "cost"},
		{`{"op":"settle","subject":"u","policy":"api","request_id":"r","cost":1000000001}`, "cost"},
		{`{"op":"settle","subject":"u","policy":"api","request_id":"r","cost":1.5}`, "cost"},
		{`{"op":"settle","policy":"api","request_id":"r","cost":1}`, "subject"},
		{`{"op":"settle","subject":"u","request_id":"r","cost":1}`, "policy"},
	}
	for _, tc := range invalid {
		var r protocol.Request
		err := protocol.Decode([]byte(tc.line), &r)
		if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Decode(%s) = %v, want INVALID naming %s", tc.line, err, tc.msg)
		}
	}
}

func TestAppendSettle(t *testing.T) {
	got := string(protocol.AppendSettle(nil, []byte(`"s"`), protocol.SettleReply{
		Settled: true, Reserved: 2000, Limit: 100000, Used: 1234, Remaining: 98766, ResetMS: 59000,
	}))
	want := `{"id":"s","ok":true,"settled":true,"replay":false,"reserved":2000,"limit":100000,"used":1234,"remaining":98766,"reset_ms":59000,"retry_after_ms":0}` + "\n"
	if got != want {
		t.Fatalf("AppendSettle = %s, want %s", got, want)
	}
	keys, _ := parseReply(t, protocol.AppendSettle(nil, nil, protocol.SettleReply{
		Headers: &protocol.HeaderFields{Policy: `"api";q=1`, RateLimit: `"api";r=1`},
	}))
	if keys[len(keys)-1] != "headers" || keys[0] != "ok" {
		t.Fatalf("keys %v: want ok first and headers last", keys)
	}
}
