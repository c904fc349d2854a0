package luascript

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// groupCalls keeps calls in order, at most MaxBatch a group, one group a
// hash slot on a Cluster, and leaves alone what the batch cannot carry.
func TestGroupCalls(t *testing.T) {
	take := func(key string) Call { return Call{s: fixedWindowTake, keys: []string{key}, args: []string{"1"}} }
	other := newScript("other.lua", "return 1", nil)
	var calls []Call
	for i := range MaxBatch + 1 {
		calls = append(calls, take("k"+strconv.Itoa(i)))
	}
	calls = append(calls, Call{}, Call{s: other, keys: []string{"x"}}, take("{a}1"), take("{a}2"), take("{b}1"))
	groups := groupCalls(false, calls)
	// Outside a Cluster every batchable call after the first 64 fills the
	// second group, the zero Call in none, the other script's alone.
	want := [][]int{seq(0, MaxBatch), {MaxBatch, MaxBatch + 3, MaxBatch + 4, MaxBatch + 5}, {MaxBatch + 2}}
	if !reflect.DeepEqual(groups, want) {
		t.Errorf("standalone groups = %v, want %v", groups, want)
	}
	groups = groupCalls(true, calls[MaxBatch+1:])
	if want := [][]int{{1}, {2, 3}, {4}}; !reflect.DeepEqual(groups, want) {
		t.Errorf("cluster groups = %v, want %v", groups, want)
	}
	// Each algorithm's calls go as its own batch script, in order of their
	// first call; on a Cluster, by slot too.
	tb := func(key string) Call { return Call{s: tokenBucketTake, keys: []string{key}, args: []string{"1"}} }
	peek := func(key string) Call { return Call{s: fixedWindowPeek, keys: []string{key}, args: []string{"1"}} }
	mixed := []Call{take("{a}1"), tb("{a}2"), peek("{a}3"), tb("{b}1"), take("{b}2"), take("{a}4")}
	if groups, want := groupCalls(false, mixed), [][]int{{0, 2, 4, 5}, {1, 3}}; !reflect.DeepEqual(groups, want) {
		t.Errorf("standalone groups of two algorithms = %v, want %v", groups, want)
	}
	if groups, want := groupCalls(true, mixed), [][]int{{0, 2, 5}, {1}, {3}, {4}}; !reflect.DeepEqual(groups, want) {
		t.Errorf("cluster groups of two algorithms = %v, want %v", groups, want)
	}
}

// Each batch script holds its own algorithm's bodies only (the take of
// several limits and its give back have one of their own), every script
// that is the prelude then its body is in exactly one, and an algorithm's
// batch script is small enough to cross a slow link quickly after Redis
// lost its scripts.
func TestBatchScriptsArePerAlgorithm(t *testing.T) {
	in := map[*script]string{}
	for _, b := range batches {
		for s, i := range b.index {
			if other, ok := in[s]; ok {
				t.Errorf("%s is in %s and %s", s.name, other, b.name)
			}
			in[s] = b.name
			if !strings.Contains(b.src, "  if i == "+strconv.Itoa(int(i))+" then\n    -- "+s.name+"\n") {
				t.Errorf("%s: body %d is not %s", b.name, i, s.name)
			}
		}
		if len(b.index) == 0 {
			t.Errorf("%s decides no script", b.name)
		}
		t.Logf("%s: %d bytes, %d bodies", b.name, len(b.src), len(b.index))
		if b.name != "batch_take_checks.lua" && len(b.src) > 42_000 {
			t.Errorf("%s is %d bytes, want at most 42,000", b.name, len(b.src))
		}
	}
	for _, alg := range algorithms {
		for _, s := range []*script{alg.take, alg.peek, alg.settle} {
			if s != nil && batchOf[s] != batchOf[alg.take] {
				t.Errorf("%s is not in its algorithm's batch script %s", s.name, batchOf[alg.take].name)
			}
		}
	}
	if batchOf[concurrencyRelease] != batchOf[concurrencyTake] {
		t.Error("the concurrency release is not in the concurrency batch script")
	}
}

func seq(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// Every script that is the prelude then its body is in the batch; one
// composed otherwise (its own helpers before the prelude) is left out, so
// that ExecBatch sends it alone.
func TestBatchCarriesThePreludeAndBodyScripts(t *testing.T) {
	for _, s := range scripts {
		// join's text: the flags line if any, the prelude, the body.
		_, body, _ := strings.Cut(s.src, "\n-- "+s.name+"\n")
		flags, _, _ := strings.Cut(s.src, "\n")
		if !strings.HasPrefix(flags, "#!") {
			flags = ""
		} else {
			flags += "\n"
		}
		_, in := batchOf[s]
		if slices.Contains(alone, s) {
			if in {
				t.Errorf("%s is sent alone, and in a batch", s.name)
			}
			continue
		}
		if joined := join(s.name, flags+body) == s.src; in != joined {
			t.Errorf("%s: in the batch %v, the prelude then its body %v", s.name, in, joined)
		}
	}
	// The take of several limits joins its take bodies inside its own body,
	// so it is the prelude then its body too.
	if _, ok := batchOf[takeChecks]; !ok {
		t.Error("the take of several limits is in no batch script")
	}
	own := &script{name: "own.lua", src: "local MINE = 1\n" + prelude + "\n-- own.lua\nreturn MINE"}
	b := newBatch("own_batch.lua", []*script{fixedWindowTake, own})
	if _, ok := b.index[own]; ok || b.index[fixedWindowTake] != 1 {
		t.Errorf("batch index %v: want the fixed window take as 1 and no own.lua", b.index)
	}
	if strings.Contains(b.src, "return MINE") {
		t.Error("the batch holds a body composed without the prelude alone")
	}
	groups := groupCalls(false, []Call{{s: own, keys: []string{"k"}}, {s: own, keys: []string{"k"}}})
	if !reflect.DeepEqual(groups, [][]int{{0}, {1}}) {
		t.Errorf("groups of a script outside the batch = %v, want each alone", groups)
	}
}

// unref is batch.lua's reading of a batch's ARGV: each decision's
// arguments, by reference or in full.
func unref(t *testing.T, args []string) [][]string {
	t.Helper()
	layout, refs := args[0], args[1]
	var out [][]string
	p := 0
	for j := 0; j < len(layout); j += 3 {
		na := int(layout[j+2])
		var own []string
		for x := range na {
			if refs == "" {
				own = append(own, args[2+p+x])
			} else {
				r := int(refs[p+x])
				if r < 1 || r > len(args)-2 {
					t.Fatalf("reference %d of %d arguments", r, len(args)-2)
				}
				own = append(own, args[1+r]) // ARGV[2 + r], 1-based
			}
		}
		p += na
		out = append(out, own)
	}
	if refs != "" && p != len(refs) || refs == "" && p != len(args)-2 {
		t.Fatalf("%d arguments laid out, ARGV has %d and %d references", p, len(args)-2, len(refs))
	}
	return out
}

// batchArgs sends an argument once where a decision repeats its script's
// last decision's in the same place, and in full when the references
// would not fit; either way each decision reads back its own arguments.
func TestBatchArgsSendSharedArgumentsOnce(t *testing.T) {
	fw := func(id string) Call {
		return Call{s: fixedWindowTake, keys: []string{"k" + id}, args: []string{"100", "60000", "1", "10", "0", id}}
	}
	// A peek of the same algorithm (the calls of one group are of one batch
	// script), whose arguments are other than the take's.
	tb := Call{s: fixedWindowPeek, keys: []string{"b"}, args: []string{"5", "1000", "5", "1", "60000", "10", "0", ""}}
	check := func(name string, calls []Call, wantSent int, wantRefs bool) {
		t.Helper()
		g := seq(0, len(calls))
		keys, args := batchArgs(calls, g)
		if len(keys) != len(calls) {
			t.Errorf("%s: %d keys for %d calls", name, len(keys), len(calls))
		}
		got := unref(t, args)
		for i, c := range calls {
			if !reflect.DeepEqual(got[i], c.args) {
				t.Errorf("%s: decision %d reads %q, sent %q", name, i, got[i], c.args)
			}
		}
		if sent := len(args) - 2; sent != wantSent || (args[1] != "") != wantRefs {
			t.Errorf("%s: %d arguments sent, references %v; want %d, %v", name, sent, args[1] != "", wantSent, wantRefs)
		}
	}
	// One policy, fresh ids: the five shared arguments once, each id once.
	calls := []Call{fw("a"), fw("b"), tb, fw("c"), tb, fw("")}
	check("one policy", calls, 5+3+8+1, true)
	// Another policy between two of the first.
	other := fw("d")
	other.args = []string{"7", "60000", "2", "10", "0", "d"}
	// Each is compared with the last of its script: what differs is sent.
	check("two policies", []Call{fw("a"), other, fw("b")}, 6+3+3, true)
	// More distinct arguments than references can name: in full.
	calls = nil
	for i := range 50 {
		c := fw(strconv.Itoa(i))
		c.args = []string{strconv.Itoa(100 + i), strconv.Itoa(60000 + i), strconv.Itoa(1 + i), strconv.Itoa(10 + i), strconv.Itoa(i % 2), "id" + strconv.Itoa(i)}
		calls = append(calls, c)
	}
	check("distinct", calls, 6*50, false)
	// More references than batch.lua reads at once: in full.
	big := Call{s: fixedWindowTake, keys: []string{"k"}, args: make([]string, maxCount)}
	for i := range big.args {
		big.args[i] = "1"
	}
	calls = nil
	for range maxRefs/maxCount + 1 {
		calls = append(calls, big)
	}
	check("many references", calls, maxCount*len(calls), false)
}
