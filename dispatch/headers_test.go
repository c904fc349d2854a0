package dispatch

import (
	"maps"
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/policy"
	"quotad/protocol"
)

// TestHeaderFieldsRender pins the exact field values of each algorithm's
// decisions, rendered from outcomes built by hand.
func TestHeaderFieldsRender(t *testing.T) {
	t.Parallel()
	window := limits.Window{Limit: 100, WindowMS: 60000}
	bucket := limits.Bucket{Rate: 10, PeriodMS: 1000, Burst: 25} // fills in 2.5 s
	leases := limits.Leases{Limit: 3, LeaseMS: 30000}
	tests := []struct {
		name string
		o    Outcome
		want protocol.HeaderFields
	}{
		{
			name: "fixed window allowed, policy",
			o: Outcome{Op: protocol.OpTake, Policy: "api", Shape: window, Allowed: true,
				Limit: 100, Used: 58, Remaining: 42, ResetMS: 16001},
			want: protocol.HeaderFields{Policy: `"api";q=100;w=60`, RateLimit: `"api";r=42;t=17`},
		},
		{
			name: "fixed window denied: Retry-After rounded up, equal to t",
			o: Outcome{Op: protocol.OpTake, Policy: "api", Shape: window,
				Limit: 100, Used: 100, ResetMS: 1, RetryAfterMS: 1},
			want: protocol.HeaderFields{Policy: `"api";q=100;w=60`, RateLimit: `"api";r=0;t=1`, RetryAfter: "1"},
		},
		{
			name: "fixed window peek of an unused subject: t is the window a take opens",
			o:    Outcome{Op: protocol.OpPeek, Shape: window, Limit: 100, Remaining: 100},
			want: protocol.HeaderFields{Policy: `"inline";q=100;w=60`, RateLimit: `"inline";r=100;t=60`},
		},
		{
			name: "sub-second window rounds w up to 1",
			o: Outcome{Op: protocol.OpTake, Shape: limits.Window{Limit: 2, WindowMS: 250}, Allowed: true,
				Limit: 2, Used: 1, Remaining: 1, ResetMS: 250},
			want: protocol.HeaderFields{Policy: `"inline";q=2;w=1`, RateLimit: `"inline";r=1;t=1`},
		},
		{
			name: "sliding window allowed: q the limit per w, t until the use has slid out",
			o: Outcome{Op: protocol.OpTake, Policy: "api", Shape: limits.Sliding{Limit: 100, WindowMS: 60000}, Allowed: true,
				Limit: 100, Used: 30, Remaining: 70, ResetMS: 90500},
			want: protocol.HeaderFields{Policy: `"api";q=100;w=60`, RateLimit: `"api";r=70;t=91`},
		},
		{
			name: "token bucket allowed: q burst, w the refill of the burst, t until full",
			o: Outcome{Op: protocol.OpTake, Policy: "burst", Shape: bucket, Allowed: true,
				Limit: 25, Used: 5, Remaining: 20, ResetMS: 500},
			want: protocol.HeaderFields{Policy: `"burst";q=25;w=3`, RateLimit: `"burst";r=20;t=1`},
		},
		{
			name: "token bucket denied: t no later than Retry-After",
			o: Outcome{Op: protocol.OpTake, Policy: "burst", Shape: bucket,
				Limit: 25, Used: 24, Remaining: 1, ResetMS: 2400, RetryAfterMS: 1100},
			want: protocol.HeaderFields{Policy: `"burst";q=25;w=3`, RateLimit: `"burst";r=1;t=2`, RetryAfter: "2"},
		},
		{
			name: "token bucket peek of a full bucket",
			o:    Outcome{Op: protocol.OpPeek, Shape: bucket, Limit: 25, Remaining: 25},
			want: protocol.HeaderFields{Policy: `"inline";q=25;w=3`, RateLimit: `"inline";r=25;t=0`},
		},
		{
			name: "concurrency allowed: concurrent-requests, no window, no t",
			o: Outcome{Op: protocol.OpTake, Policy: "jobs", Shape: leases, Allowed: true,
				Limit: 3, Used: 1, Remaining: 2, ResetMS: 30000, LeaseMS: 30000},
			want: protocol.HeaderFields{Policy: `"jobs";q=3;qu="concurrent-requests"`, RateLimit: `"jobs";r=2`},
		},
		{
			name: "concurrency denied",
			o: Outcome{Op: protocol.OpTake, Policy: "jobs", Shape: leases,
				Limit: 3, Used: 3, ResetMS: 30000, RetryAfterMS: 12345},
			want: protocol.HeaderFields{Policy: `"jobs";q=3;qu="concurrent-requests"`, RateLimit: `"jobs";r=0`, RetryAfter: "13"},
		},
		{
			name: "shadow policy that would deny: allowed, so no Retry-After",
			o: Outcome{Op: protocol.OpTake, Policy: "api", Shape: window, Allowed: true, Shadow: true,
				Limit: 100, Used: 100, ResetMS: 30000},
			want: protocol.HeaderFields{Policy: `"api";q=100;w=60`, RateLimit: `"api";r=0;t=30`},
		},
		{
			name: "degraded allow: the state is unknown, so no RateLimit",
			o: Outcome{Op: protocol.OpTake, Policy: "api", Shape: window, Allowed: true, Degraded: true,
				Limit: 100, Remaining: 100},
			want: protocol.HeaderFields{Policy: `"api";q=100;w=60`},
		},
		{
			name: "degraded deny",
			o: Outcome{Op: protocol.OpTake, Policy: "api", Shape: window, Degraded: true,
				Limit: 100, Remaining: 100, RetryAfterMS: 1000},
			want: protocol.HeaderFields{Policy: `"api";q=100;w=60`, RetryAfter: "1"},
		},
		{
			name: "an algorithm without its own items gets q, r and t",
			o: Outcome{Op: protocol.OpTake, Policy: "new", Shape: otherShape{}, Allowed: true,
				Limit: 9, Used: 2, Remaining: 7, ResetMS: 1500},
			want: protocol.HeaderFields{Policy: `"new";q=9`, RateLimit: `"new";r=7;t=2`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Headers = true
			got := tc.o.headerFields()
			if got == nil || *got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// otherShape is an algorithm's shape the registry does not know.
type otherShape struct{}

func (otherShape) Algorithm() string { return "other" }
func (otherShape) Validate() error   { return nil }
func (otherShape) Quota() int64      { return 9 }

func TestHeaderFieldsOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	base := Outcome{Op: protocol.OpTake, Shape: limits.Window{Limit: 5, WindowMS: 1000}, Allowed: true, Limit: 5, Remaining: 4, ResetMS: 900}
	without := base.AppendReply(nil, nil)
	if strings.Contains(string(without), "headers") {
		t.Errorf("not asked, got %s", without)
	}
	asked := base
	asked.Headers = true
	if got, want := string(asked.AppendReply(nil, nil)), strings.TrimSuffix(string(without), "}\n")+
		`,"headers":{"RateLimit-Policy":"\"inline\";q=5;w=1","RateLimit":"\"inline\";r=4;t=1"}}`+"\n"; got != want {
		t.Errorf("asked:\n got %s want %s", got, want)
	}
	failed := asked
	failed.fail(protocol.CodeConflict, "x")
	if got := string(failed.AppendReply(nil, nil)); strings.Contains(got, "headers") {
		t.Errorf("an error reply has no headers: %s", got)
	}
	release := Outcome{Op: protocol.OpRelease, Headers: true, Shape: limits.Leases{Limit: 1, LeaseMS: 1000}, Limit: 1}
	if got := string(release.AppendReply(nil, nil)); strings.Contains(got, "headers") {
		t.Errorf("a release has no headers: %s", got)
	}
}

// TestHeaderFieldsMultipleItems: several limits are one list member each,
// in order, which is how a decision of several checks renders.
func TestHeaderFieldsMultipleItems(t *testing.T) {
	t.Parallel()
	got := renderHeaders([]headerItem{
		{name: "user", quota: 10, windowS: 1, remaining: 0, resetS: 1, hasReset: true},
		{name: "tenant", quota: 1000, windowS: 3600, remaining: 500, resetS: 1800, hasReset: true},
		{name: "jobs", quota: 3, unit: "concurrent-requests", remaining: 1},
	}, true, 900, true)
	want := protocol.HeaderFields{
		Policy:     `"user";q=10;w=1, "tenant";q=1000;w=3600, "jobs";q=3;qu="concurrent-requests"`,
		RateLimit:  `"user";r=0;t=1, "tenant";r=500;t=1, "jobs";r=1`,
		RetryAfter: "1",
	}
	if *got != want {
		t.Errorf("got %+v\nwant %+v", *got, want)
	}
}

func TestAppendSFString(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"api.v2-x_Y": `"api.v2-x_Y"`, `a"b\c`: `"a\"b\\c"`, "tab\there\u00e9": `"tab?here??"`,
	} {
		if got := string(appendSFString(nil, in)); got != want {
			t.Errorf("%q: got %s, want %s", in, got, want)
		}
	}
}

// TestHeaderFieldsThroughRedis: the fields of real decisions carry the
// numbers of the decision itself.
func TestHeaderFieldsThroughRedis(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	st := openStore(t, r)
	cfg := &policy.Config{Policies: map[string]*policy.Policy{
		"api": {Name: "api", Algorithm: limits.FixedWindow, Limit: 2, WindowMS: 60000, Mode: policy.ModeEnforce,
			OnUnavailable: policy.OnUnavailableError, MaxRequestIDs: limits.DefaultMaxRequestIDs},
	}}
	d := newDispatcher(t, st, cfg, nil)
	denied := 0
	for _, line := range []string{
		`{"op":"take","subject":"h","policy":"api","headers":true}`,
		`{"op":"take","subject":"h","policy":"api","headers":true}`,
		`{"op":"take","subject":"h","policy":"api","headers":true}`,
		`{"op":"peek","subject":"h","policy":"api","headers":true}`,
	} {
		o := decide(t, d, line)
		rep := decodeReply(t, string(o.AppendReply(nil, nil)))
		want := map[string]string{
			"RateLimit-Policy": `"api";q=2;w=60`,
			"RateLimit":        `"api";r=` + strconv.FormatInt(rep.Remaining, 10) + ";t=" + strconv.FormatInt(seconds(rep.ResetMS), 10),
		}
		if o.Op == protocol.OpTake && !rep.Allowed {
			want["Retry-After"] = strconv.FormatInt(seconds(rep.RetryAfterMS), 10)
			denied++
		}
		if !maps.Equal(rep.Headers, want) || rep.ResetMS < 1 {
			t.Errorf("%s: reply %+v, headers %q, want %q", line, rep, rep.Headers, want)
		}
	}
	if denied != 1 {
		t.Errorf("%d takes denied, want the third only", denied)
	}
	if o := decide(t, d, `{"op":"take","subject":"h","policy":"api"}`); strings.Contains(string(o.AppendReply(nil, nil)), "headers") {
		t.Errorf("a take that did not ask got headers")
	}
}
