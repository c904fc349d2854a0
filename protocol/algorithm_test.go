package protocol_test

import (
	"errors"
	"testing"

	"quotad/protocol"
)

func TestDecodeAlgorithms(t *testing.T) {
	type algo struct {
		Op                                    protocol.Op
		Algorithm                             string
		Limit, Rate, PeriodMS, Burst, LeaseMS int64
		RequestID                             string
	}
	for _, tt := range []struct {
		name string
		line string
		want algo
	}{
		{"token bucket", `{"op":"take","subject":"s","algorithm":"token_bucket","rate":10,"period_ms":1000,"burst":20}`,
			algo{Op: protocol.OpTake, Algorithm: "token_bucket", Rate: 10, PeriodMS: 1000, Burst: 20}},
		{"token bucket burst defaults to rate", `{"op":"peek","subject":"s","algorithm":"token_bucket","rate":10,"period_ms":1000}`,
			algo{Op: protocol.OpPeek, Algorithm: "token_bucket", Rate: 10, PeriodMS: 1000, Burst: 10}},
		{"concurrency", `{"op":"take","subject":"s","algorithm":"concurrency","limit":2,"lease_ms":30000,"request_id":"job-1"}`,
			algo{Op: protocol.OpTake, Algorithm: "concurrency", Limit: 2, LeaseMS: 30000, RequestID: "job-1"}},
		{"release inline", `{"op":"release","subject":"s","algorithm":"concurrency","limit":2,"lease_ms":30000,"request_id":"job-1"}`,
			algo{Op: protocol.OpRelease, Algorithm: "concurrency", Limit: 2, LeaseMS: 30000, RequestID: "job-1"}},
		{"release by policy", `{"op":"release","subject":"s","policy":"jobs","request_id":"job-1"}`,
			algo{Op: protocol.OpRelease, RequestID: "job-1"}},
		{"explicit fixed window", `{"op":"take","subject":"s","algorithm":"fixed_window","limit":2,"window_ms":1000}`,
			algo{Op: protocol.OpTake, Algorithm: "fixed_window", Limit: 2}},
		{"refill of exactly 31 days", `{"op":"take","subject":"s","algorithm":"token_bucket","rate":1,"period_ms":1339200000,"burst":2}`,
			algo{Op: protocol.OpTake, Algorithm: "token_bucket", Rate: 1, PeriodMS: 1339200000, Burst: 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var r protocol.Request
			if err := protocol.Decode([]byte(tt.line), &r); err != nil {
				t.Fatalf("Decode(%s): %v", tt.line, err)
			}
			got := algo{Op: r.Op, Algorithm: r.Algorithm, Limit: r.Limit, Rate: r.Rate, PeriodMS: r.PeriodMS, Burst: r.Burst, LeaseMS: r.LeaseMS, RequestID: r.RequestID}
			if got != tt.want {
				t.Fatalf("Decode(%s) = %+v, want %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestDecodeAlgorithmsInvalid(t *testing.T) {
	for name, line := range map[string]string{
		"unknown algorithm":             `{"op":"take","subject":"s","algorithm":"leaky","rate":1,"period_ms":1}`,
		"algorithm not a string":        `{"op":"take","subject":"s","algorithm":1,"rate":1,"period_ms":1}`,
		"policy and algorithm":          `{"op":"take","subject":"s","policy":"p","algorithm":"token_bucket"}`,
		"policy and rate":               `{"op":"take","subject":"s","policy":"p","rate":1}`,
		"token bucket without period":   `{"op":"take","subject":"s","algorithm":"token_bucket","rate":1}`,
		"token bucket with window_ms":   `{"op":"take","subject":"s","algorithm":"token_bucket","rate":1,"period_ms":1,"window_ms":1}`,
		"token bucket with limit":       `{"op":"take","subject":"s","algorithm":"token_bucket","rate":1,"period_ms":1,"limit":1}`,
		"rate without algorithm":        `{"op":"take","subject":"s","rate":1,"period_ms":1}`,
		"rate 0":                        `{"op":"take","subject":"s","algorithm":"token_bucket","rate":0,"period_ms":1}`,
		"rate 1.5":                      `{"op":"take","subject":"s","algorithm":"token_bucket","rate":1.5,"period_ms":1}`,
		"burst 0":                       `{"op":"take","subject":"s","algorithm":"token_bucket","rate":1,"period_ms":1,"burst":0}`,
		"refill over 31 days":           `{"op":"take","subject":"s","algorithm":"token_bucket","rate":1,"period_ms":1339200001,"burst":2}`,
		"concurrency without lease":     `{"op":"take","subject":"s","algorithm":"concurrency","limit":1,"request_id":"a"}`,
		"concurrency with window_ms":    `{"op":"take","subject":"s","algorithm":"concurrency","limit":1,"lease_ms":1,"window_ms":1,"request_id":"a"}`,
		"concurrency limit too big":     `{"op":"take","subject":"s","algorithm":"concurrency","limit":100001,"lease_ms":1,"request_id":"a"}`,
		"lease_ms over 31 days":         `{"op":"take","subject":"s","algorithm":"concurrency","limit":1,"lease_ms":2678400001,"request_id":"a"}`,
		"fixed window with lease":       `{"op":"take","subject":"s","algorithm":"fixed_window","limit":1,"window_ms":1,"lease_ms":1}`,
		"release without request_id":    `{"op":"release","subject":"s","policy":"p"}`,
		"release with a bad request_id": `{"op":"release","subject":"s","policy":"p","request_id":"a b"}`,
		"release without subject":       `{"op":"release","policy":"p","request_id":"a"}`,
		"duplicate algorithm":           `{"op":"take","subject":"s","algorithm":"token_bucket","algorithm":"token_bucket","rate":1,"period_ms":1}`,
	} {
		var r protocol.Request
		if err := protocol.Decode([]byte(line), &r); !errors.Is(err, protocol.ErrInvalid) {
			t.Errorf("%s: Decode(%s) = %v, want INVALID", name, line, err)
		}
	}
}

func TestAppendAlgorithmReplies(t *testing.T) {
	got := string(protocol.AppendTake(nil, []byte("1"), protocol.TakeReply{Allowed: true, Limit: 2, Used: 1, Remaining: 1, ResetMS: 30000, LeaseMS: 30000}))
	want := `{"id":1,"ok":true,"allowed":true,"replay":false,"limit":2,"used":1,"remaining":1,"reset_ms":30000,"retry_after_ms":0,"lease_ms":30000}` + "\n"
	if got != want {
		t.Errorf("take with a lease\n got %s\nwant %s", got, want)
	}
	got = string(protocol.AppendRelease(nil, nil, protocol.ReleaseReply{Released: true, Limit: 2, Used: 0, Remaining: 2}))
	want = `{"ok":true,"released":true,"limit":2,"used":0,"remaining":2}` + "\n"
	if got != want {
		t.Errorf("release\n got %s\nwant %s", got, want)
	}
	if protocol.OpRelease.String() != "release" {
		t.Errorf("OpRelease.String() = %q", protocol.OpRelease.String())
	}
}
