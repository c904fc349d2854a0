package luascript

import (
	"slices"
	"strings"
	"testing"

	"quotad/limits"
)

// Everything an algorithm's scripts need follows from one declaration:
// a test fails when a registered algorithm lacks a piece.
func TestEveryAlgorithmHasItsPieces(t *testing.T) {
	names := []string{limits.FixedWindow, limits.TokenBucket, limits.Concurrency, limits.SlidingWindow, limits.Calendar}
	if len(algorithms) != len(names) {
		t.Fatalf("algorithms has %d entries, want %v", len(algorithms), names)
	}
	for _, name := range names {
		alg, ok := algorithms[name]
		if !ok {
			t.Errorf("%s has no scripts", name)
			continue
		}
		// An algorithm with allotments reserves and returns.
		if (alg.reserve != nil) != slices.Contains(limits.AllotmentAlgorithms, name) || (alg.reserve == nil) != (alg.ret == nil) {
			t.Errorf("%s: reserve %v and return %v, allotments %v", name, alg.reserve != nil, alg.ret != nil,
				slices.Contains(limits.AllotmentAlgorithms, name))
		}
		for _, s := range []*script{alg.take, alg.peek, alg.settle, alg.reserve, alg.ret} {
			if s == nil {
				continue // a lease is released, not settled
			}
			if !slices.Contains(scripts, s) {
				t.Errorf("%s: %s is not in scripts (load.go)", name, s.name)
			}
			// Its arguments are checked as its contract says.
			if s.c == nil || !strings.Contains(s.body, s.c.checksLua()) {
				t.Errorf("%s: %s does not check its arguments by its contract (--#args)", name, s.name)
			}
			if len(s.fields) != len(s.c.argv()) {
				t.Errorf("%s: %s writes %d arguments, its contract has %d", name, s.name, len(s.fields), len(s.c.argv()))
			}
		}
		// A take of several limits runs its take and, on a Redis
		// Cluster, gives it back.
		i := slices.IndexFunc(takeBodies, func(mb takeBody) bool { return mb.s == alg.take })
		if i < 0 {
			t.Errorf("%s: its take is not in takeBodies (takechecks.go)", name)
			continue
		}
		mb := takeBodies[i]
		if mb.c != alg.take.c {
			t.Errorf("%s: takeBodies names another contract than its take's", name)
		}
		if !strings.Contains(giveBack.src, "\nlocal function "+mb.give+"(c)\n") {
			t.Errorf("%s: give_back.lua defines no %s", name, mb.give)
		}
		if mb.c.index("id") == 0 {
			t.Errorf("%s: its take has no request_id", name)
		}
	}
}

// A call writes each argument where its contract puts it.
func TestCallsFollowTheirContracts(t *testing.T) {
	a := Args{
		Key: "k", Limit: 7, WindowMS: 60_000, LeaseMS: 30_000, TokenBucket: TokenBucket{Rate: 3, PeriodMS: 1000, Burst: 5},
		Spec: "7:hour:UTC:monday:0", Cost: 2, RequestID: "id", Strict: true, MaxRequestIDs: 9, DedupeMS: 4000,
		Periods: CalendarPeriods{Starts: [3]int64{1, 2, 3}, Edges: [4]int64{10, 20, 30, 40}},
		Want:    6, SharePPM: 50_000, Seq: 11, Kept: 3,
	}
	want := map[string]string{
		"limit": "7", "window": "60000", "lease": "30000", "rate": "3", "period": "1000", "burst": "5", "cost": "2",
		"maxids": "9", "dedupe": "4000", "strict": "1", "id": "id", "spec": a.Spec, "e1": "10", "e2": "20", "e3": "30", "e4": "40",
		"want": "6", "share": "50000", "seq": "11", "kept": "3",
	}
	for _, s := range scripts {
		if s.c == nil {
			continue
		}
		c := s.call(&a)
		for i, x := range s.c.argv() {
			if c.args[i] != want[x.name] {
				t.Errorf("%s: ARGV[%d] (%s) = %q, want %q", s.name, i+1, x.name, c.args[i], want[x.name])
			}
		}
		if len(c.keys) != s.c.keys {
			t.Errorf("%s: %d keys, its contract has %d", s.name, len(c.keys), s.c.keys)
		}
	}
}
