package protocol_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"quotad/protocol"
)

func TestDecodeChecks(t *testing.T) {
	var r protocol.Request
	line := `{"id":3,"op":"take","request_id":"r-1","cost":2,"headers":true,"timeout_ms":50,"checks":[` +
		`{"policy":"per-user","subject":"user:42"},` +
		`{"subject":"tenant:7","algorithm":"token_bucket","rate":10,"period_ms":1000,"cost":5},` +
		`{"subject":"t","algorithm":"concurrency","limit":3,"lease_ms":1000,"note":{"x":[1]}}]}`
	if err := protocol.Decode([]byte(line), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Checks) != 3 || r.Subject != "" || r.Policy != "" || r.HasInline() {
		t.Fatalf("take %+v", r)
	}
	c0, c1, c2 := r.Checks[0], r.Checks[1], r.Checks[2]
	if c0.Op != protocol.OpTake || c0.Policy != "per-user" || c0.Subject != "user:42" || c0.Cost != 2 ||
		c0.RequestID != "r-1" || !c0.Headers || c0.InlineShape() != nil {
		t.Fatalf("check 1 %+v", c0)
	}
	if c1.Cost != 5 || c1.InlineAlgorithm() != protocol.AlgorithmTokenBucket || c1.Burst != 10 || c1.InlineShape() == nil {
		t.Fatalf("check 2 %+v", c1)
	}
	if c2.InlineAlgorithm() != protocol.AlgorithmConcurrency || c2.Cost != 2 {
		t.Fatalf("check 3 %+v", c2)
	}
	// A decoded request reuses the checks' array; a take of one has none.
	if err := protocol.Decode([]byte(`{"op":"take","subject":"s","policy":"p"}`), &r); err != nil || len(r.Checks) != 0 {
		t.Fatalf("take of one after checks: %+v, %v", r.Checks, err)
	}
}

func TestDecodeChecksRefusals(t *testing.T) {
	one := `{"policy":"p","subject":"s"}`
	nine := strings.Repeat(one+",", 8) + one
	for _, tc := range []struct{ line, want string }{
		{`{"op":"take","checks":[]}`, "1 to 8 checks"},
		{`{"op":"take","checks":[` + nine + `]}`, "1 to 8 checks"},
		{`{"op":"take","checks":{}}`, "array of objects"},
		{`{"op":"take","checks":[1]}`, "array of objects"},
		{`{"op":"peek","checks":[` + one + `]}`, "checks is for take"},
		{`{"op":"release","request_id":"a","checks":[` + one + `]}`, "checks is for take"},
		{`{"op":"take","subject":"s","checks":[` + one + `]}`, "either checks or subject"},
		{`{"op":"take","policy":"p","checks":[` + one + `]}`, "either checks or subject"},
		{`{"op":"take","checks":[{"policy":"p"}]}`, "check 1: subject is required"},
		{`{"op":"take","checks":[` + one + `,{"subject":"s"}]}`, "check 2: give policy"},
		{`{"op":"take","checks":[{"subject":"s","policy":"p","limit":3,"window_ms":9}]}`, "check 1: give either policy"},
		{`{"op":"take","checks":[{"subject":"s","policy":"p","cost":0}]}`, "check 1: cost"},
		{`{"op":"take","checks":[{"subject":"s","policy":"p","request_id":"x"}]}`, "check 1: request_id is the take's"},
		{`{"op":"take","checks":[{"subject":"s","policy":"p","op":"peek"}]}`, "check 1: op is the take's"},
		{`{"op":"take","checks":[{"subject":"s","policy":"p","headers":true}]}`, "check 1: headers is the take's"},
		{`{"op":"take","checks":[{"subject":"s","policy":"p","checks":[]}]}`, "check 1: checks is the take's"},
		{`{"op":"take","checks":[{"subject":"s","subject":"t","policy":"p"}]}`, `duplicate field "subject"`},
		{`{"op":"take","checks":[` + one + `],"checks":[` + one + `]}`, `duplicate field "checks"`},
		{`{"op":"take","checks":[{"subject":"s","algorithm":"token_bucket","rate":1}]}`, "check 1: token_bucket needs"},
		{`{"op":"take","cost":0,"checks":[` + one + `]}`, "cost must be"},
		{`{"op":"take","request_id":"a b","checks":[` + one + `]}`, "request_id must be"},
	} {
		var r protocol.Request
		err := protocol.Decode([]byte(tc.line), &r)
		if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Decode(%s) = %v, want INVALID with %q", tc.line, err, tc.want)
		}
	}
	// A syntax error inside a check is one, and the id is still echoed.
	var r protocol.Request
	if err := protocol.Decode([]byte(`{"id":"x","op":"take","checks":[{"subject":"s",}]}`), &r); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("syntax error in a check: %v", err)
	}
	if err := protocol.Decode([]byte(`{"op":"take","checks":[{"subject":1,"policy":"p"}],"id":"x"}`), &r); err == nil || string(r.ID) != `"x"` {
		t.Fatalf("type error in a check: %v, id %s", err, r.ID)
	}
}

func TestAppendChecks(t *testing.T) {
	line := protocol.AppendChecks(nil, []byte(`7`), protocol.ChecksReply{
		Allowed: false, RetryAfterMS: 900,
		Checks: []protocol.CheckReply{
			{Allowed: true, Limit: 10, Used: 3, Remaining: 7, ResetMS: 500},
			{Allowed: false, Limit: 100, Used: 100, ResetMS: 900, RetryAfterMS: 900, LeaseMS: 5, Shadow: true, ShadowAllowed: false},
			{Allowed: true, Limit: 4, Remaining: 4, Skipped: true},
		},
		Headers: &protocol.HeaderFields{Policy: `"a";q=10`, RateLimit: `"a";r=7`},
	})
	want := `{"id":7,"ok":true,"allowed":false,"replay":false,"retry_after_ms":900,"checks":[` +
		`{"allowed":true,"replay":false,"limit":10,"used":3,"remaining":7,"reset_ms":500,"retry_after_ms":0},` +
		`{"allowed":false,"replay":false,"limit":100,"used":100,"remaining":0,"reset_ms":900,"retry_after_ms":900,"lease_ms":5,"shadow":true,"shadow_allowed":false},` +
		`{"allowed":true,"replay":false,"limit":4,"used":0,"remaining":4,"reset_ms":0,"retry_after_ms":0,"skipped":true}],` +
		`"headers":{"RateLimit-Policy":"\"a\";q=10","RateLimit":"\"a\";r=7"}}` + "\n"
	if string(line) != want {
		t.Fatalf("reply\n%s\nwant\n%s", line, want)
	}
	if !json.Valid(line) {
		t.Fatal("not JSON")
	}
}
