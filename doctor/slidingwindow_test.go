package doctor

import (
	"context"
	"strconv"
	"testing"
	"time"

	"quotad/integration/redistest"
)

// doctor knows the sliding window's keys: their algorithm, their records,
// and, for one that lost its TTL, its window.
func TestDoctorSlidingWindowKeys(t *testing.T) {
	r := redistest.Start(t)
	prefix := "q:"
	do := func(args ...string) {
		t.Helper()
		if err := r.Do(t, args...).Error(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	lost := prefix + "sw:{p:search:lost}"
	do("HSET", lost, "s", "0", "c", "1", "p", "0", "policy", "10:45000", "ids", "0", "qh", "0", "qt", "0")
	busy := []string{"HSET", prefix + "sw:{i:busy}", "s", "0", "c", "50", "p", "0", "policy", "100:60000", "ids", "50", "qh", "0", "qt", "50"}
	for i := range 50 {
		id := "req-" + strconv.Itoa(i)
		busy = append(busy, "r:"+id, "1:"+strconv.Itoa(i+1)+":99999999999999", "q:"+strconv.Itoa(i), id+":99999999999999")
	}
	do(busy...)
	do("PEXPIRE", prefix+"sw:{i:busy}", "60000")

	rep, err := Run(context.Background(), r.Client(t), Options{KeyPrefix: prefix, Fix: true, DefaultTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.NoTTL) != 1 || rep.NoTTL[0].Key != lost || rep.NoTTL[0].Algorithm != "sliding_window" || !rep.NoTTL[0].Fixed || rep.NoTTL[0].TTLMS != 45000 {
		t.Fatalf("no TTL = %+v, want the lost window fixed with its own 45000 ms", rep.NoTTL)
	}
	if len(rep.Largest) != 1 || rep.Largest[0].RequestIDs != 50 || rep.Largest[0].Fields != 107 {
		t.Fatalf("largest = %+v, want the busy window's 50 request ids", rep.Largest)
	}
	for _, p := range rep.Policies {
		if p.Algorithm != "sliding_window" {
			t.Fatalf("per policy = %+v, want sliding_window keys only", rep.Policies)
		}
	}
	if ttl := pttl(t, r, lost); ttl < 1 || ttl > 45000 {
		t.Fatalf("PTTL after fix = %d", ttl)
	}
}
