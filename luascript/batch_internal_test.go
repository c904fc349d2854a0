package luascript

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// groupCalls keeps calls in order, at most MaxBatch a group, one group a
// hash slot on a Cluster, and leaves alone what the batch cannot carry.
func TestGroupCalls(t *testing.T) {
	take := func(key string) Call { return Call{s: fixedWindowTake, keys: []string{key}, args: []string{"1"}} }
	other := newScript("other.lua", "return 1")
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
		_, in := batchIndex[s]
		if joined := join(s.name, flags+body) == s.src; in != joined {
			t.Errorf("%s: in the batch %v, the prelude then its body %v", s.name, in, joined)
		}
	}
	// The take of several limits joins its take bodies inside its own body,
	// so it is the prelude then its body too.
	if _, ok := batchIndex[multiTake]; !ok {
		t.Error("the take of several limits is not in the batch")
	}
	own := &script{name: "own.lua", src: "local MINE = 1\n" + prelude + "\n-- own.lua\nreturn MINE"}
	b, index := newBatch([]*script{fixedWindowTake, own})
	if _, ok := index[own]; ok || index[fixedWindowTake] != 1 {
		t.Errorf("batch index %v: want the fixed window take as 1 and no own.lua", index)
	}
	if strings.Contains(b.src, "return MINE") {
		t.Error("the batch holds a body composed without the prelude alone")
	}
	groups := groupCalls(false, []Call{{s: own, keys: []string{"k"}}, {s: own, keys: []string{"k"}}})
	if !reflect.DeepEqual(groups, [][]int{{0}, {1}}) {
		t.Errorf("groups of a script outside the batch = %v, want each alone", groups)
	}
}
