package rls

import (
	"bytes"
	"errors"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"quotad/limits"
	"quotad/rls/descriptors"
)

const fuzzConfig = `
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 3, name: u}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 5, unit_multiplier: 30, replaces: [{name: u}]}
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 0}
  - key: tenant
    rate_limit: {unit: year, requests_per_unit: 7}
    quota_mode: true
  - key: shadow
    rate_limit: {unit: day, requests_per_unit: 1}
    shadow_mode: true
  - key: free
    rate_limit: {unlimited: true}
  - key: app
    rate_limit: {quotad_policy: api}
`

// requestOf builds a request from data: a protobuf RateLimitRequest when
// data is one, else fields split at 0 bytes (domain, then key and value
// pairs), descriptors split at 1 bytes, 2 bytes adding a hits_addend of
// the next byte, 3 a limit override.
func requestOf(data []byte) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{}
	if proto.Unmarshal(data, req) == nil && req.GetDomain() != "" {
		return req
	}
	req = &rlsv3.RateLimitRequest{}
	descs := bytes.Split(data, []byte{1})
	for i, d := range descs {
		fields := bytes.Split(d, []byte{0})
		if i == 0 {
			req.Domain, fields = string(fields[0]), fields[1:]
		}
		rd := &ratelimitv3.RateLimitDescriptor{}
		for j := 0; j < len(fields); j++ {
			f := fields[j]
			switch {
			case len(f) == 2 && f[0] == 2:
				rd.HitsAddend = wrapperspb.UInt64(uint64(f[1]))
			case len(f) == 1 && f[0] == 4:
				rd.IsNegativeHits = true
			case len(f) == 3 && f[0] == 3:
				rd.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(f[1]), Unit: typev3.RateLimitUnit(f[2] % 8)}
			case j+1 < len(fields):
				rd.Entries = append(rd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: string(f), Value: string(fields[j+1])})
				j++
			}
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}

// FuzzRequest maps requests built from bytes onto a descriptors file: it
// never panics, refuses with ErrInvalid, and a plan it makes is one a
// dispatcher can take: a place per descriptor, valid windows, costs within
// the bounds, at most limits.MaxChecks checks.
func FuzzRequest(f *testing.F) {
	cfg, err := descriptors.Parse("fuzz.yaml", []byte(fuzzConfig))
	if err != nil {
		f.Fatal(err)
	}
	tab := &table{cfg: cfg, domains: map[string]bool{"edge": true}}
	quotaOf := func(p string) (int64, bool, bool) { return 5, false, p == "api" }
	seed, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/api/x"}, {Key: "method", Value: "GET"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "a"}}, HitsAddend: wrapperspb.UInt64(0)},
	}})
	f.Add(seed)
	for _, s := range []string{
		"edge\x00user\x00a", "edge\x00user\x00a\x01user\x00a", "edge\x00path\x00/api/q\x00method\x00PUT\x01tenant\x00t\x00\x02\x09",
		"edge\x00app\x00shop\x01shadow\x00s", "edge\x00user\x00a\x00\x04\x01tenant\x00t\x00\x04", "edge\x00free\x00x\x01\x03\x05\x04user\x00b", "nowhere\x00\x03\x01\x02user\x00x", "\x00user\x00a", "edge",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := requestOf(data)
		p, err := planOf(tab, req, quotaOf)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if len(p.items) != len(req.GetDescriptors()) || len(p.checks) > limits.MaxChecks {
			t.Fatalf("%d items, %d checks for %d descriptors", len(p.items), len(p.checks), len(req.GetDescriptors()))
		}
		for i, it := range p.items {
			switch {
			case it.check < 0:
			case it.peek && it.check >= len(p.peeks), !it.peek && it.check >= len(p.checks):
				t.Fatalf("item %d's check %d is out of range", i, it.check)
			}
		}
		for _, cs := range [][]check{p.checks, p.peeks} {
			for _, c := range cs {
				if c.req.Cost < 0 || c.req.Cost > int64(len(req.GetDescriptors()))*(limits.MaxLimit+1) {
					t.Fatalf("cost %d", c.req.Cost)
				}
				if c.given != nil && !c.over {
					if err := c.given.Shape.Validate(); err != nil {
						t.Fatalf("window %+v: %v", c.given.Shape, err)
					}
				}
			}
		}
	})
}
