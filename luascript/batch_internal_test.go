package luascript

import (
	"reflect"
	"strconv"
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
