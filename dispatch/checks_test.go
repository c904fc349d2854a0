package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

// Every check is its own member of both fields, in order; a skipped
// check's state is unknown, so it is in RateLimit-Policy only; a degraded
// take has no RateLimit field.
func TestCheckHeaderFieldsRender(t *testing.T) {
	t.Parallel()
	window := limits.Window{Limit: 10, WindowMS: 60000}
	bucket := limits.Bucket{Rate: 10, PeriodMS: 1000, Burst: 20}
	user := Outcome{Op: protocol.OpTake, Policy: "user", Shape: window, Allowed: true, Limit: 10, Used: 3, Remaining: 7, ResetMS: 30000}
	tenant := Outcome{Op: protocol.OpTake, Policy: "tenant", Shape: bucket, Limit: 20, Used: 20, ResetMS: 2000, RetryAfterMS: 1500}
	for _, tc := range []struct {
		name string
		o    Outcome
		want protocol.HeaderFields
	}{
		{
			name: "allowed",
			o:    Outcome{Op: protocol.OpTake, Headers: true, Allowed: true, Checks: []Outcome{user, user}},
			want: protocol.HeaderFields{Policy: `"user";q=10;w=60, "user";q=10;w=60`, RateLimit: `"user";r=7;t=30, "user";r=7;t=30`},
		},
		{
			name: "denied by the second: t at most Retry-After",
			o:    Outcome{Op: protocol.OpTake, Headers: true, RetryAfterMS: 1500, Checks: []Outcome{user, tenant}},
			want: protocol.HeaderFields{Policy: `"user";q=10;w=60, "tenant";q=20;w=2`,
				RateLimit: `"user";r=7;t=2, "tenant";r=0;t=2`, RetryAfter: "2"},
		},
		{
			name: "skipped",
			o: Outcome{Op: protocol.OpTake, Headers: true, RetryAfterMS: 1500,
				Checks: []Outcome{{Op: protocol.OpTake, Policy: "user", Shape: window, Allowed: true, Skipped: true, Limit: 10, Remaining: 10}, tenant}},
			want: protocol.HeaderFields{Policy: `"user";q=10;w=60, "tenant";q=20;w=2`, RateLimit: `"tenant";r=0;t=2`, RetryAfter: "2"},
		},
		{
			name: "degraded",
			o:    Outcome{Op: protocol.OpTake, Headers: true, Degraded: true, Allowed: true, Checks: []Outcome{user, tenant}},
			want: protocol.HeaderFields{Policy: `"user";q=10;w=60, "tenant";q=20;w=2`},
		},
	} {
		if got := *tc.o.headerFields(); got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

// A check that had room in a denied take reports what it has: nothing of
// the take was consumed.
func TestUnappliedReportsTheStateAsItIs(t *testing.T) {
	t.Parallel()
	o := Outcome{Algorithm: limits.FixedWindow, Allowed: true, Limit: 10, Used: 5, Remaining: 5}
	unapplied(&o, 2)
	if o.Used != 3 || o.Remaining != 7 {
		t.Fatalf("fixed window %+v", o)
	}
	o = Outcome{Algorithm: limits.Concurrency, Allowed: true, Limit: 3, Used: 2, Remaining: 1, LeaseMS: 100}
	unapplied(&o, 5)
	if o.Used != 1 || o.Remaining != 2 || o.LeaseMS != 0 {
		t.Fatalf("concurrency %+v", o)
	}
	for _, o := range []Outcome{{Allowed: true, Replay: true, Used: 5, Limit: 10, Remaining: 5}, {Used: 5, Limit: 10, Remaining: 5}} {
		used, remaining := o.Used, o.Remaining
		unapplied(&o, 2)
		if o.Used != used || o.Remaining != remaining {
			t.Fatalf("a replay or a denial changed: %+v", o)
		}
	}
}

// The steps of a take whose keys are in several slots: one group per
// slot, in the order the slots first appear.
func TestSlotGroups(t *testing.T) {
	t.Parallel()
	got := slotGroups([]check{{key: "a{x}"}, {key: "b{y}"}, {key: "c{x}"}, {key: "{z}"}, {key: "{y}d"}})
	want := [][]int{{0, 2}, {1, 4}, {3}}
	if len(got) != len(want) {
		t.Fatalf("groups %v, want %v", got, want)
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("groups %v, want %v", got, want)
		}
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Fatalf("groups %v, want %v", got, want)
			}
		}
	}
}

// decisionsByResult reads quotad_decisions_total from reg, by
// algorithm/result.
func decisionsByResult(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "quotad_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["algorithm"]+"/"+labels["result"]] += m.GetCounter().GetValue()
		}
	}
	return got
}

// A take of checks that one check refuses before anything is sent is one
// error reply naming the check, and every check is counted under it, the
// checks after the refused one too.
func TestTakeOfChecksRefusedBeforeRedis(t *testing.T) {
	r := redistest.Start(t)
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewRegistry()
	d := New(Options{Store: openStore(t, r), AllowInline: true, Logger: zap.New(core), Registry: reg, LogDecisions: LogDecisionsAll})
	t.Cleanup(d.Close)
	o := decide(t, d, `{"op":"take","checks":[{"subject":"a","limit":5,"window_ms":60000},`+
		`{"policy":"nope","subject":"b"},{"subject":"c","limit":5,"window_ms":60000}]}`)
	if o.Code != protocol.CodeUnknownPolicy || !strings.HasPrefix(o.Message, "check 2: ") {
		t.Fatalf("outcome %+v, want UNKNOWN_POLICY naming check 2", o)
	}
	got := decisionsByResult(t, reg)
	if got["fixed_window/UNKNOWN_POLICY"] != 1 || got["/UNKNOWN_POLICY"] != 2 {
		t.Fatalf("decisions by algorithm/result = %v, want each of the three checks counted as UNKNOWN_POLICY", got)
	}
	if n := logs.FilterLoggerName("decision").Len(); n != 3 {
		t.Fatalf("%d decision log lines, want one per check", n)
	}
	if n := r.ScriptCalls(t); n != 0 {
		t.Fatalf("Redis ran %d scripts for a refused take", n)
	}
}

// The local denial is one rule over the checks: a take is denied from
// memory when an enforced check is known to deny (the others skipped, and
// never turned by shadow mode), and answered from memory when every check
// is known to deny, shadow ones included, as a shadow take of one limit
// is. Otherwise Redis decides, and nothing of the local answer remains.
func TestLocalDenialOverChecks(t *testing.T) {
	r := redistest.Start(t)
	cfg, err := policy.ParseConfig([]byte("policies:\n" +
		"  shadow:\n    limit: 1\n    window: 1m\n    mode: shadow\n" +
		"  enforced:\n    limit: 1\n    window: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := newDispatcher(t, openStore(t, r), cfg, nil)
	const (
		shadow   = `{"policy":"shadow","subject":"s"}`
		enforced = `{"policy":"enforced","subject":"e"}`
		fresh    = `{"policy":"enforced","subject":"f"}`
	)
	// Use both limits up, then have Redis deny each once: the local
	// denial now knows both.
	for _, c := range []string{shadow, enforced} {
		for range 2 {
			decide(t, d, `{"op":"take","checks":[`+c+`]}`)
		}
	}
	scripts := r.ScriptCalls(t)

	o := decide(t, d, `{"op":"take","checks":[`+shadow+`,`+enforced+`]}`)
	if o.Allowed || len(o.Checks) != 2 || !o.Checks[0].Skipped || o.Checks[0].Shadow || !o.Checks[1].Local || o.Checks[1].Allowed ||
		o.RetryAfterMS != o.Checks[1].RetryAfterMS || o.RetryAfterMS <= 0 {
		t.Fatalf("take with an enforced check known to deny = %+v", o)
	}
	o = decide(t, d, `{"op":"take","checks":[`+shadow+`]}`)
	if !o.Allowed || !o.Checks[0].Local || !o.Checks[0].Shadow || o.Checks[0].ShadowAllowed || o.RetryAfterMS != 0 {
		t.Fatalf("take whose one shadow check is known to deny = %+v, want allowed from memory, shadow_allowed false", o)
	}
	if n := r.ScriptCalls(t); n != scripts {
		t.Fatalf("Redis ran %d scripts for takes the local denial answered", n-scripts)
	}
	o = decide(t, d, `{"op":"take","checks":[`+shadow+`,`+fresh+`]}`)
	if !o.Allowed || o.Checks[0].Local || o.Checks[0].ShadowAllowed || !o.Checks[0].Shadow || !o.Checks[1].Allowed || o.Checks[1].Used != 1 {
		t.Fatalf("take with a shadow check known to deny and a fresh one = %+v, want both decided by Redis", o)
	}
	if n := r.ScriptCalls(t); n != scripts+1 {
		t.Fatalf("Redis ran %d scripts for a take it had to decide, want 1", n-scripts)
	}
}

// classify is the one reading of an error: its reply code, its
// quotad_redis_errors_total kind and what the breaker learns, which
// depends on the call's timing for a timeout.
func TestClassifyKindAndHealth(t *testing.T) {
	d := New(Options{Logger: zap.NewNop(), RedisTimeout: time.Second})
	t.Cleanup(d.Close)
	now := time.Now()
	full := &trip{queued: now, sent: now, deadline: now.Add(time.Second)}
	queued := &trip{queued: now, sent: now.Add(600 * time.Millisecond), deadline: now.Add(time.Second)}
	// The batcher's patience is a quarter of the deadline: a call sent
	// within it had three quarters of the deadline at Redis.
	patient := &trip{queued: now, sent: now.Add(200 * time.Millisecond), deadline: now.Add(time.Second)}
	impatient := &trip{queued: now, sent: now.Add(300 * time.Millisecond), deadline: now.Add(time.Second)}
	own := &trip{queued: now, sent: now, deadline: now.Add(100 * time.Millisecond), own: true}
	timeout := fmt.Errorf("take: %w", context.DeadlineExceeded)
	for _, tc := range []struct {
		name   string
		err    error
		t      *trip
		code   protocol.Code
		kind   string
		health store.Health
	}{
		{"answered", nil, full, "", "", store.HealthUp},
		{"script error", &luascript.Error{Code: luascript.CodeConflict, Message: "x"}, full, protocol.CodeConflict, "", store.HealthUp},
		{"timeout with the whole deadline at redis", timeout, full, protocol.CodeUnavailable, "timeout", store.HealthDown},
		{"timeout after queueing most of the deadline", timeout, queued, protocol.CodeUnavailable, "timeout", store.HealthNone},
		{"timeout after queueing less than a quarter", timeout, patient, protocol.CodeUnavailable, "timeout", store.HealthDown},
		{"timeout after queueing more than a quarter", timeout, impatient, protocol.CodeUnavailable, "timeout", store.HealthNone},
		{"timeout of a request's own deadline", timeout, own, protocol.CodeUnavailable, "timeout", store.HealthNone},
		// Held back while its script was loaded: sent late, it had less.
		{"timeout after waiting for the script", &luascript.HeldError{Sent: now.Add(300 * time.Millisecond), Err: timeout}, full,
			protocol.CodeUnavailable, "timeout", store.HealthNone},
		{"timeout after a short wait for the script", &luascript.HeldError{Sent: now.Add(10 * time.Millisecond), Err: timeout}, full,
			protocol.CodeUnavailable, "timeout", store.HealthDown},
		{"script not loaded in time", fmt.Errorf("take: %w", luascript.ErrNotLoaded), full, protocol.CodeUnavailable, "", store.HealthNone},
		{"redis refusal", &rueidis.RedisError{}, full, protocol.CodeInternal, "", store.HealthUp},
		{"lost connection", errors.New("connection reset"), full, protocol.CodeUnavailable, "connection", store.HealthDown},
		{"caller gave up", context.Canceled, full, protocol.CodeUnavailable, "", store.HealthNone},
		{"breaker open", store.ErrBreakerOpen, nil, protocol.CodeUnavailable, "", store.HealthNone},
		{"not run in time", ErrWaitedTooLong, nil, protocol.CodeUnavailable, "", store.HealthNone},
		{"refused in prepare", invalid("x"), nil, protocol.CodeInvalid, "", store.HealthNone},
	} {
		f := d.classify(tc.err, tc.t)
		if f.code != tc.code || f.kind != tc.kind || f.health != tc.health {
			t.Errorf("%s: code %q kind %q health %v, want %q %q %v", tc.name, f.code, f.kind, f.health, tc.code, tc.kind, tc.health)
		}
	}
}
