package main

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The allotment rows asked for with -rows are measured with their
// targets, the 10,000-subject pair in wideRounds rounds however few
// -rounds asks, and the rows not asked for are not.
func TestBenchMeasuresTheAllotmentRows(t *testing.T) {
	out := runBench(t, options{quotad: quotadBin, duration: 60 * time.Millisecond, rounds: 1, rows: "hot|10,000"})
	want := []string{
		"allotment rows: hot keys",
		"hot keys, pipelining, allotments vs in-process", "hot keys, pipelining, Redis CPU per decision vs original",
		"hot keys, one at a time, allotments vs in-process", "hot keys, one at a time, p99 allotments vs in-process",
		"10,000 subjects, allotments vs without", "5 rounds)",
	}
	for i := rowHot; i <= rowWideExact; i++ {
		want = append(want, matrix[i].name)
	}
	wantLines(t, out, want)
	// No quotad row of them had an error reply.
	for _, i := range []int{rowHot, rowHotExact, rowHotOne, rowHotOneExact, rowWide, rowWideExact} {
		if strings.Contains(out, "error replies of "+matrix[i].name+", all rounds") {
			t.Errorf("%s had error replies:\n%s", matrix[i].name, out)
		}
	}
}

// The in-process client's hot keys move on before the original script's
// limit: no key of a uniform spread over the subjects takes it.
func TestHotKeysStayBelowTheOriginalLimit(t *testing.T) {
	h := &hotKeys{subjects: hotSubjects}
	rng := rand.New(rand.NewPCG(1, 2))
	uses := map[string]int{}
	for range 2*hotSubjects*hotKeyUses + 10*hotSubjects {
		uses[h.key("r1-", rng.Uint64())]++
	}
	most := 0
	for _, n := range uses {
		most = max(most, n)
	}
	if most >= limit {
		t.Fatalf("a hot key took %d decisions: the original script would deny past %d", most, limit)
	}
	if len(uses) <= 2*hotSubjects {
		t.Fatalf("%d keys: the subjects never moved on twice", len(uses))
	}
}
