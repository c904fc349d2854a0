package dispatch

import (
	"testing"

	"quotad/limits"
	"quotad/protocol"
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
