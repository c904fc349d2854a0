package doctor

import (
	"context"
	"strconv"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/limits"
)

// The doctor knows the calendar's keys: each period's window is counted
// under its policy, and its request ids and a lost TTL are found.
func TestDoctorKnowsCalendarKeys(t *testing.T) {
	for rest, want := range map[string]PolicyKeys{
		"cal:{p:daily:alice}:1764547200000": {Algorithm: "calendar", Policy: "daily"},
		"cal:{i:alice}:1764547200000":       {Algorithm: "calendar", Inline: true},
	} {
		if got := parseKey(rest); got != want {
			t.Errorf("parseKey(%q) = %+v, want %+v", rest, got, want)
		}
	}

	r := redistest.Start(t)
	const prefix = "q:"
	// A month of Shanghai's, with jitter: the doctor restores the TTL the
	// scripts would have given it.
	month := limits.CalendarWindow{Limit: 100, Period: "month", TimeZone: "Asia/Shanghai", WeekStart: time.Monday, JitterMS: 3_600_000}
	start, end := month.Bounds(time.Now().Add(-month.Offset("lost")))
	lost := prefix + "cal:{p:daily:lost}:" + strconv.FormatInt(start.UnixMilli(), 10)
	expireAt := end.Add(month.Offset("lost")).UnixMilli() + 1000
	ids := []string{"HSET", prefix + "cal:{p:daily:busy}:1764547200000", "used", "40", "policy", "100:day:UTC:-:0", "ids", "40"}
	for i := range 40 {
		ids = append(ids, "r:id-"+string(rune('a'+i%26))+string(rune('a'+i/26)), "1:1")
	}
	for _, args := range [][]string{
		ids,
		{"PEXPIRE", prefix + "cal:{p:daily:busy}:1764547200000", "60000"},
		{"HSET", lost, "used", "1", "policy", month.Spec(), "ids", "0"},
	} {
		if err := r.Do(t, args...).Error(); err != nil {
			t.Fatal(err)
		}
	}
	before := time.Now()
	rep, err := Run(context.Background(), r.Client(t), Options{KeyPrefix: prefix, Fix: true})
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Policies) != 1 || rep.Policies[0] != (PolicyKeys{Algorithm: "calendar", Policy: "daily", Keys: 2}) {
		t.Fatalf("policies = %+v, want 2 calendar keys of daily", rep.Policies)
	}
	if len(rep.NoTTL) != 1 || rep.NoTTL[0].Algorithm != "calendar" || !rep.NoTTL[0].Fixed {
		t.Fatalf("no_ttl = %+v, want the lost calendar window, fixed", rep.NoTTL)
	}
	if ttl := rep.NoTTL[0].TTLMS; ttl < expireAt-after.UnixMilli() || ttl > expireAt-before.UnixMilli() {
		t.Fatalf("restored TTL %d ms, want until the month's end %v plus the jitter and a second", ttl, end)
	}
	if len(rep.Largest) == 0 || rep.Largest[0].RequestIDs != 40 {
		t.Fatalf("largest = %+v, want the 40 ids of busy", rep.Largest)
	}
	redistest.AssertAllKeysHaveTTL(t, r.Client(t), prefix)
}
