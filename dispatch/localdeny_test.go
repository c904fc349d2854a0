package dispatch

import (
	"strconv"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/policy"
	"quotad/protocol"
)

func TestLocalDenyMemoryIsBounded(t *testing.T) {
	d := newLocalDeny(64)
	cfg := &policy.Config{}
	now := time.Now()
	denial := func(key string, allowed bool, resetMS int64) *Decision {
		return takeOfOne(cfg, now, key, limits.Window{Limit: 1, WindowMS: 60000},
			Outcome{Op: protocol.OpTake, Limit: 1, Used: 1, Allowed: allowed, ResetMS: resetMS})
	}
	record := func(dec *Decision) {
		hold, need := fixedWindow{}.DeniedFor(&dec.Out, dec.req.Cost)
		d.record(dec, 0, hold, need)
	}
	size := func() int {
		n := 0
		for i := range d.shards {
			n += len(d.shards[i].m)
		}
		return n
	}
	for i := range 10_000 {
		record(denial("k"+strconv.Itoa(i), false, 60000))
	}
	if n := size(); n > 64 {
		t.Fatalf("%d entries after 10000 denials, want at most 64", n)
	}
	// The newest is remembered and answers; an acceptance forgets it.
	if !d.answer(denial("k9999", false, 0), 0, now) {
		t.Fatal("the latest denial was forgotten")
	}
	record(denial("k9999", true, 60000))
	if d.answer(denial("k9999", false, 0), 0, now) {
		t.Fatal("a denial was remembered past an acceptance")
	}
	// An ended window answers nothing and is dropped.
	record(denial("old", false, 10))
	if d.answer(denial("old", false, 0), 0, now.Add(10*time.Millisecond)) {
		t.Fatal("a window was denied locally after its end")
	}
	// Another shape, another config: not the same limits.
	record(denial("shape", false, 60000))
	other := denial("shape", false, 0)
	other.checks[0].limit.Shape = limits.Window{Limit: 2, WindowMS: 60000}
	if d.answer(other, 0, now) {
		t.Fatal("a denial answered a take under other limits")
	}
	other = denial("shape", false, 0)
	other.cfg = &policy.Config{}
	if d.answer(other, 0, now) {
		t.Fatal("a denial answered a take under a reloaded config")
	}
}

// takeOfOne is a take of one fixed window check on key under shape, as
// Prepare and a call sent at sent leave it, answered out.
func takeOfOne(cfg *policy.Config, sent time.Time, key string, shape limits.Window, out Outcome) *Decision {
	dec := &Decision{req: &protocol.Request{Op: protocol.OpTake, Cost: 1}, cfg: cfg, Out: out}
	dec.checks = dec.one[:]
	dec.checks[0] = check{req: dec.req, key: key, limit: Limit{Algorithm: fixedWindow{}, Shape: shape}, sent: sent}
	return dec
}

// A token bucket refills while its denial holds: the local answer reports
// the tokens there are now, as Redis would (at most one more, since it
// counts from before Redis's answer; one fewer than the peek after it, if
// a token came in between), not those at the denial.
func TestLocalDenialOfABucketReportsItsRefill(t *testing.T) {
	r := redistest.Start(t)
	d := newDispatcher(t, openStore(t, r), nil, nil)
	const bucket = `"algorithm":"token_bucket","rate":10,"period_ms":1000,"burst":10`
	if o := decide(t, d, `{"op":"take","subject":"b",`+bucket+`,"cost":10}`); !o.Allowed {
		t.Fatalf("first take = %+v", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"b",`+bucket+`,"cost":10}`); o.Allowed || o.Local || o.Remaining != 0 {
		t.Fatalf("second take = %+v, want denied by Redis with nothing left", o)
	}
	time.Sleep(300 * time.Millisecond) // three tokens' worth: the clock is the subject
	local := decide(t, d, `{"op":"take","subject":"b",`+bucket+`,"cost":10}`)
	peek := decide(t, d, `{"op":"peek","subject":"b",`+bucket+`}`)
	if local.Allowed || !local.Local {
		t.Fatalf("take after 300 ms = %+v, want denied locally", local)
	}
	if local.Remaining+1 < peek.Remaining || local.Remaining > peek.Remaining+1 || local.Used != 10-local.Remaining {
		t.Fatalf("local answer remaining %d used %d; Redis's peek right after says remaining %d", local.Remaining, local.Used, peek.Remaining)
	}
	if local.Remaining == 0 {
		t.Fatalf("local answer %+v reports the bucket as it was at the denial", local)
	}
}
