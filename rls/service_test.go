package rls_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"quotad/limits"
	"quotad/rls"
)

// Days, so that no window ends during a test.
const edge = `
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3, name: per-user}
  - key: path
    value: /login
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: app
    rate_limit: {quotad_policy: api}
`

const apiPolicy = `
policies:
  api:
    limit: 4
    window: 24h
`

func TestLimitCountsAndDenies(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	req := request("edge", []string{"user", "alice"})
	for i := range 3 {
		resp := e.call(req)
		if resp.GetOverallCode() != ok || !slices.Equal(remaining(resp), []uint32{uint32(2 - i)}) {
			t.Fatalf("call %d = %v, want OK with %d remaining", i+1, resp, 2-i)
		}
	}
	resp := e.call(req)
	if resp.GetOverallCode() != over || !slices.Equal(statusCodes(resp), []rlsv3.RateLimitResponse_Code{over}) {
		t.Fatalf("fourth call = %v, want OVER_LIMIT", resp)
	}
	st := resp.GetStatuses()[0]
	cl := st.GetCurrentLimit()
	if cl.GetName() != "per-user" || cl.GetRequestsPerUnit() != 3 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
		t.Errorf("current_limit = %v, want per-user, 3 per DAY", cl)
	}
	// The window is the UTC day, as envoyproxy/ratelimit counts it.
	now := time.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	if d := st.GetDurationUntilReset().AsDuration(); d <= 0 || d > midnight.Sub(now)+time.Second {
		t.Errorf("duration_until_reset = %v, want at most %v", d, midnight.Sub(now))
	}
	// Another value of the key is another counter.
	if resp := e.call(request("edge", []string{"user", "bob"})); resp.GetOverallCode() != ok {
		t.Errorf("another user = %v, want OK", resp)
	}
}

// A request over any of its limits consumes nothing anywhere.
func TestAllOrNothing(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	both := request("edge", []string{"path", "/login"}, []string{"tenant", "t1"})
	if resp := e.call(both); resp.GetOverallCode() != ok || !slices.Equal(remaining(resp), []uint32{4, 0}) {
		t.Fatalf("first = %v, want OK, 4 and 0 remaining", resp)
	}
	for i := range 3 {
		resp := e.call(both)
		if resp.GetOverallCode() != over || !slices.Equal(statusCodes(resp), []rlsv3.RateLimitResponse_Code{ok, over}) {
			t.Fatalf("over the tenant's limit = %v, want OVER_LIMIT by the second", resp)
		}
		// The path's counter reports its state: nothing was taken. Once
		// Redis said the tenant is over, the sidecar denies without
		// asking, and the path's state is unknown (0).
		if got := resp.GetStatuses()[0].GetLimitRemaining(); i == 0 && got != 4 || i > 0 && got != 4 && got != 0 {
			t.Fatalf("path remaining %d after denied call %d, want 4 (unchanged)", got, i+1)
		}
	}
	if resp := e.call(request("edge", []string{"path", "/login"})); !slices.Equal(remaining(resp), []uint32{3}) {
		t.Fatalf("path alone = %v, want 3 remaining: the denied calls took nothing", resp)
	}
}

func TestUnknownDomainNoMatchAndUnlimited(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	for _, req := range []*rlsv3.RateLimitRequest{
		request("nowhere", []string{"user", "a"}),
		request("edge", []string{"path", "/other"}),
		request("edge", []string{"user", "a", "deeper", "x"}),
	} {
		resp := e.call(req)
		if resp.GetOverallCode() != ok || len(resp.GetStatuses()) != 1 || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Errorf("%v = %v, want OK without a limit", req, resp)
		}
	}
	resp := e.call(request("edge", []string{"free", "x"}, []string{"nomatch", "y"}))
	if resp.GetOverallCode() != ok || !slices.Equal(remaining(resp), []uint32{^uint32(0), 0}) {
		t.Errorf("unlimited = %v, want OK with max remaining, then OK without limit", resp)
	}
	if ks := e.keys(); len(ks) != 0 {
		t.Errorf("keys %v, want none: nothing was limited", ks)
	}
}

func TestCost(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	req := request("edge", []string{"path", "/login"})
	req.HitsAddend = 2
	if resp := e.call(req); !slices.Equal(remaining(resp), []uint32{3}) {
		t.Fatalf("request hits_addend 2 = %v, want 3 remaining", resp)
	}
	// The descriptor's own hits_addend wins; 0 checks without consuming.
	if resp := e.call(hits(request("edge", []string{"path", "/login"}), 0, 0)); resp.GetOverallCode() != ok || !slices.Equal(remaining(resp), []uint32{3}) {
		t.Fatalf("hits_addend 0 = %v, want OK, 3 remaining", resp)
	}
	if resp := e.call(hits(request("edge", []string{"path", "/login"}), 0, 3)); !slices.Equal(remaining(resp), []uint32{0}) {
		t.Fatalf("hits_addend 3 = %v, want 0 remaining", resp)
	}
	// More than the limit holds is over it, whatever is left.
	if resp := e.call(hits(request("edge", []string{"user", "u"}), 0, 4)); resp.GetOverallCode() != over {
		t.Fatalf("hits_addend above the limit = %v, want OVER_LIMIT", resp)
	}
	if resp := e.call(request("edge", []string{"user", "u"})); !slices.Equal(remaining(resp), []uint32{2}) {
		t.Fatalf("after a cost above the limit = %v, want 2 remaining: nothing was taken", resp)
	}
	// Two descriptors of one counter take it once, at the sum.
	resp := e.call(request("edge", []string{"user", "v"}, []string{"user", "v"}))
	if !slices.Equal(remaining(resp), []uint32{1, 1}) {
		t.Fatalf("one counter twice = %v, want 1 remaining for both", resp)
	}
}

func TestLimitOverride(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	req := request("edge", []string{"user", "o"})
	req.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}
	if resp := e.call(req); resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1 {
		t.Fatalf("override = %v, want OK under 1 per day", resp)
	}
	if resp := e.call(req); resp.GetOverallCode() != over {
		t.Fatalf("override's second = %v, want OVER_LIMIT", resp)
	}
	// Not for an unknown domain.
	unknown := request("nowhere", []string{"user", "o"})
	unknown.Descriptors[0].Limit = req.Descriptors[0].Limit
	for range 2 {
		if resp := e.call(unknown); resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Fatalf("override of an unknown domain = %v, want OK without a limit", resp)
		}
	}
	bad := request("edge", []string{"user", "o"})
	bad.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	if _, err := e.callErr(bad); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("override without a unit: %v, want INVALID_ARGUMENT", err)
	}
}

func TestReplaces(t *testing.T) {
	e := setup(t, `
domain: r
descriptors:
  - key: a
    rate_limit: {unit: day, requests_per_unit: 1, name: small}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 10, replaces: [{name: small}]}
`, apiPolicy)
	for i := range 3 {
		resp := e.call(request("r", []string{"a", "x"}, []string{"b", "y"}))
		if resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetCurrentLimit() != nil || remaining(resp)[1] != uint32(9-i) {
			t.Fatalf("call %d = %v, want OK: a replaced, b counting", i+1, resp)
		}
	}
	e.call(request("r", []string{"a", "x"}))
	if resp := e.call(request("r", []string{"a", "x"})); resp.GetOverallCode() != over {
		t.Fatalf("a alone = %v, want OVER_LIMIT on its second call: it was never taken while replaced", resp)
	}
}

func TestShadowMode(t *testing.T) {
	e := setup(t, `
domain: s
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 1}
    shadow_mode: true
  - key: strict
    rate_limit: {unit: day, requests_per_unit: 1}
`, apiPolicy)
	req := request("s", []string{"k", "v"})
	e.call(req)
	resp := e.call(req)
	if resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetCode() != ok || remaining(resp)[0] != 0 {
		t.Fatalf("shadow over the limit = %v, want OK with 0 remaining", resp)
	}
	// An override is never in shadow mode.
	o := request("s", []string{"k", "w"})
	o.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}
	e.call(o)
	if resp := e.call(o); resp.GetOverallCode() != over {
		t.Fatalf("override of a shadow descriptor = %v, want OVER_LIMIT", resp)
	}
}

func TestQuotaMode(t *testing.T) {
	e := setup(t, `
domain: q
descriptors:
  - key: a
    rate_limit: {unit: day, requests_per_unit: 1}
    quota_mode: true
  - key: b
    rate_limit: {unit: day, requests_per_unit: 2}
    quota_mode: true
  - key: c
    rate_limit: {unit: day, requests_per_unit: 5}
`, apiPolicy)
	req := request("q", []string{"a", "x"}, []string{"b", "x"}, []string{"c", "x"})
	if resp := e.call(req); resp.GetOverallCode() != ok {
		t.Fatalf("first = %v, want OK", resp)
	}
	// a is over: the request passes on b, which is not, and a takes nothing.
	resp := e.call(req)
	if resp.GetOverallCode() != ok || !slices.Equal(statusCodes(resp), []rlsv3.RateLimitResponse_Code{over, ok, ok}) ||
		!slices.Equal(remaining(resp), []uint32{0, 0, 3}) {
		t.Fatalf("a over = %v, want OK with a OVER_LIMIT, b and c taken", resp)
	}
	// Both quota descriptors over: the request is over, and c takes nothing.
	resp = e.call(req)
	if resp.GetOverallCode() != over || !slices.Equal(statusCodes(resp), []rlsv3.RateLimitResponse_Code{over, over, ok}) {
		t.Fatalf("all quota over = %v, want OVER_LIMIT", resp)
	}
	if resp := e.call(request("q", []string{"c", "x"})); remaining(resp)[0] != 2 {
		t.Fatalf("c alone = %v, want 2 remaining: the denied call took nothing", resp)
	}
}

// A descriptor naming a quotad policy counts in that policy's window, with
// the value of its last entry as the subject: the JSON socket's takes of
// that policy and subject count against the same window.
func TestQuotadPolicyShared(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	if o := e.take("api", "shop", 2); !o.Allowed || o.Remaining != 2 {
		t.Fatalf("socket take = %+v, want allowed, 2 remaining", o)
	}
	resp := e.call(request("edge", []string{"app", "shop"}))
	if resp.GetOverallCode() != ok || remaining(resp)[0] != 1 || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 4 {
		t.Fatalf("rls = %v, want OK with 1 remaining of 4", resp)
	}
	if o := e.take("api", "shop", 1); !o.Allowed || o.Remaining != 0 {
		t.Fatalf("socket take = %+v, want allowed, 0 remaining", o)
	}
	if resp := e.call(request("edge", []string{"app", "shop"})); resp.GetOverallCode() != over {
		t.Fatalf("rls = %v, want OVER_LIMIT", resp)
	}
}

func TestDynamicMetadata(t *testing.T) {
	e := setup(t, `
domain: m
descriptors:
  - key: a
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata: {team: {name: payments}, tier: gold}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 5}
    metadata: {team: {pager: on}}
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 5}
`, apiPolicy)
	req := request("m", []string{"a", "x"}, []string{"b", "y"})
	md := e.call(req).GetDynamicMetadata().AsMap()
	want := map[string]any{"team": map[string]any{"name": "payments", "pager": "on"}, "tier": "gold"}
	if md["domain"] != "m" || !equalJSON(md["metadata"], want) {
		t.Fatalf("dynamic_metadata = %v, want domain m and metadata %v", md, want)
	}
	if ds, _ := md["descriptors"].([]any); len(ds) != 2 {
		t.Errorf("descriptors = %v, want the request's 2", md["descriptors"])
	}
	// a is over: only b's metadata, of the descriptors that passed.
	md = e.call(req).GetDynamicMetadata().AsMap()
	if !equalJSON(md["metadata"], map[string]any{"team": map[string]any{"pager": "on"}}) {
		t.Fatalf("metadata with a over = %v, want b's only", md["metadata"])
	}
	if resp := e.call(request("m", []string{"plain", "z"})); resp.GetDynamicMetadata() != nil {
		t.Errorf("dynamic_metadata without metadata = %v, want none", resp.GetDynamicMetadata())
	}
}

func equalJSON(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok || len(a) != len(bm) {
			return false
		}
		for k, v := range a {
			if !equalJSON(v, bm[k]) {
				return false
			}
		}
		return true
	}
	return a == b
}

// envoyproxy/ratelimit's windows: N units from the Unix epoch, a month of
// 30 days; unit_multiplier multiplies the window.
func TestEpochWindows(t *testing.T) {
	e := setup(t, `
domain: w
descriptors:
  - key: m
    rate_limit: {unit: month, requests_per_unit: 5}
  - key: s30
    rate_limit: {unit: second, requests_per_unit: 5, unit_multiplier: 30}
`, apiPolicy)
	for _, tc := range []struct {
		key     string
		seconds int64
		unit    rlsv3.RateLimitResponse_RateLimit_Unit
	}{{"m", 30 * 86_400, rlsv3.RateLimitResponse_RateLimit_MONTH}, {"s30", 30, rlsv3.RateLimitResponse_RateLimit_SECOND}} {
		before := time.Now()
		resp := e.call(request("w", []string{tc.key, "v"}))
		st := resp.GetStatuses()[0]
		if st.GetCurrentLimit().GetUnit() != tc.unit || st.GetDurationUntilReset().AsDuration() > time.Duration(tc.seconds)*time.Second {
			t.Errorf("%s: %v, want unit %v and a reset within %d s", tc.key, st, tc.unit, tc.seconds)
		}
		var start int64 = -1
		for _, k := range e.keys() {
			if strings.HasSuffix(k[:strings.LastIndexByte(k, ':')], "e:{w}1:w"+strconv.Itoa(len(tc.key))+":"+tc.key+"1:v") {
				start, _ = strconv.ParseInt(k[strings.LastIndexByte(k, ':')+1:], 10, 64)
			}
		}
		// The key names its period's start: a multiple of the window from
		// the epoch, holding the call's time.
		ms := tc.seconds * 1000
		if start < 0 || start%ms != 0 || start > time.Now().UnixMilli() || start+ms < before.UnixMilli() {
			t.Errorf("%s: keys %v, want one of a period starting at a multiple of %d ms", tc.key, e.keys(), ms)
		}
	}
}

func TestInvalidArgument(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	long := strings.Repeat("x", limits.MaxRLSValueBytes+1)
	many := request("edge")
	for range limits.MaxRLSDescriptors + 1 {
		many.Descriptors = append(many.Descriptors, request("edge", []string{"user", "a"}).Descriptors[0])
	}
	deep := request("edge", nil)
	for range limits.MaxRLSEntries + 1 {
		deep.Descriptors[0].Entries = append(deep.Descriptors[0].Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	for name, tc := range map[string]struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		"empty domain":   {request("", []string{"user", "a"}), "domain"},
		"no descriptors": {request("edge"), "descriptors"},
		"no entries":     {request("edge", nil), "no entries"},
		"empty key":      {request("edge", []string{"", "a"}), "empty key"},
		"long value":     {request("edge", []string{"user", long}), "value longer"},
		"long key":       {request("edge", []string{long, "a"}), "key longer"},
		"many":           {many, "descriptors"},
		"deep":           {deep, "entries"},
	} {
		_, err := e.callErr(tc.req)
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %q", name, err, tc.want)
		}
	}
	if ks := e.keys(); len(ks) != 0 {
		t.Errorf("keys %v after bad requests, want none", ks)
	}
	if resp := e.call(request("edge", []string{"user", "a"})); resp.GetOverallCode() != ok {
		t.Errorf("after bad requests = %v, want OK: the server goes on", resp)
	}
	// A message above the size bound is refused by gRPC before decoding.
	huge := request("edge", []string{"user", strings.Repeat("x", rls.MaxMessageBytes)})
	if _, err := e.callErr(huge); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a message over %d bytes: %v, want RESOURCE_EXHAUSTED", rls.MaxMessageBytes, err)
	}
}

// is_negative_hits gives its cost back to the current window, never below
// zero, and a counter known to be over its limit is asked again after it.
func TestNegativeHits(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	negative := func(k, v string, n uint64) *rlsv3.RateLimitRequest {
		req := hits(request("edge", []string{k, v}), 0, n)
		req.Descriptors[0].IsNegativeHits = true
		return req
	}
	e.call(hits(request("edge", []string{"path", "/login"}), 0, 3))
	if resp := e.call(negative("path", "/login", 2)); resp.GetOverallCode() != ok || remaining(resp)[0] != 4 {
		t.Fatalf("give back 2 of 3 = %v, want OK, 4 remaining", resp)
	}
	if resp := e.call(negative("path", "/login", 10)); remaining(resp)[0] != 5 {
		t.Fatalf("give back above the use = %v, want 5 remaining", resp)
	}
	// The tenant's limit is 1: the second call is denied by Redis, the
	// third by the sidecar from that denial, until a give back.
	req := request("edge", []string{"tenant", "n"})
	e.call(req)
	for range 2 {
		if resp := e.call(req); resp.GetOverallCode() != over {
			t.Fatalf("over the tenant's limit = %v", resp)
		}
	}
	e.call(negative("tenant", "n", 1))
	if resp := e.call(req); resp.GetOverallCode() != ok {
		t.Fatalf("after a give back = %v, want OK", resp)
	}
	if _, err := e.callErr(negative("app", "shop", 1)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("negative hits on a quotad policy: %v, want INVALID_ARGUMENT", err)
	}
}
