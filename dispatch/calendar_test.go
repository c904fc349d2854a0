package dispatch

import (
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
	"quotad/policy"
	"quotad/protocol"
)

// setClock moves the sidecar's clock for calendar periods by skew.
func setClock(t *testing.T, skew time.Duration) {
	t.Cleanup(func() { calendarClock = time.Now })
	calendarClock = func() time.Time { return time.Now().Add(skew) }
}

// A denied calendar take is denied locally, for costs above what is left,
// until the period ends; smaller costs still go to Redis.
func TestCalendarLocalDenial(t *testing.T) {
	r := redistest.Start(t)
	d := newDispatcher(t, openStore(t, r), nil, nil)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, r.Client(t), "qt:") })
	line := `{"op":"take","subject":"u","algorithm":"calendar","limit":3,"period":"month","time_zone":"Europe/Berlin","cost":2}`
	if o := decide(t, d, line); !o.Allowed || o.Local {
		t.Fatalf("first take = %+v", o)
	}
	o := decide(t, d, line)
	if o.Allowed || o.Local || o.RetryAfterMS <= 0 {
		t.Fatalf("second take = %+v, want denied by Redis", o)
	}
	o2 := decide(t, d, line)
	if o2.Allowed || !o2.Local || o2.Used != 2 || o2.RetryAfterMS <= 0 || o2.RetryAfterMS > o.RetryAfterMS {
		t.Fatalf("third take = %+v, want denied locally until the month's end", o2)
	}
	one := strings.Replace(line, `"cost":2`, `"cost":1`, 1)
	if o := decide(t, d, one); !o.Allowed || o.Local || o.Used != 3 {
		t.Fatalf("take of what is left = %+v, want allowed by Redis", o)
	}
}

// Every sidecar counts an instant in the period of Redis's clock: one
// whose clock is half an hour out counts in the same hour, and one a
// period or more out is refused with nothing written, without counting as
// a Redis failure.
func TestCalendarSkewedSidecar(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r)
	d := newDispatcher(t, st, nil, nil)
	client := r.Client(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, client, "qt:") })
	line := `{"op":"take","subject":"u","algorithm":"calendar","limit":10,"period":"hour","time_zone":"Asia/Kolkata"}`
	c := limits.CalendarWindow{Limit: 10, Period: "hour", TimeZone: "Asia/Kolkata"}
	start, _ := c.Bounds(time.Now())
	for _, skew := range []time.Duration{0, -30 * time.Minute, 30 * time.Minute} {
		setClock(t, skew)
		if o := decide(t, d, line); !o.Allowed {
			t.Fatalf("skew %v: %+v", skew, o)
		}
	}
	if s, _ := c.Bounds(time.Now()); !s.Equal(start) {
		t.Skip("the hour turned during the test; its takes are in two hours")
	}
	key := luascript.CalendarPeriodKey(luascript.CalendarKey("qt:", "", "u"), start.UnixMilli())
	if n, err := r.Do(t, "HGET", key, "used").ToString(); err != nil || n != "3" {
		t.Fatalf("%s used = %q, %v; want the three takes in Redis's hour", key, n, err)
	}
	setClock(t, -3*time.Hour)
	o := decide(t, d, line)
	if o.Code != protocol.CodeInternal || !strings.Contains(o.Message, luascript.CodeClockSkew) {
		t.Fatalf("take three hours behind = %+v, want INTERNAL CLOCK_SKEW", o)
	}
	if !st.Up() {
		t.Fatal("a skewed clock counted as a Redis failure")
	}
}

// A named calendar policy's new limit applies at once to the live period.
func TestCalendarPolicyChangeAppliesAtOnce(t *testing.T) {
	r := redistest.Start(t)
	parse := func(limit string) *policy.Config {
		cfg, err := policy.ParseConfig([]byte("policies:\n  daily:\n    algorithm: calendar\n    period: day\n    limit: " + limit + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	d := newDispatcher(t, openStore(t, r), parse("2"), nil)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, r.Client(t), "qt:") })
	take := `{"op":"take","subject":"u","policy":"daily"}`
	decide(t, d, take)
	decide(t, d, take)
	if o := decide(t, d, take); o.Allowed {
		t.Fatalf("third take under limit 2 = %+v", o)
	}
	d.SetConfig(parse("3"))
	if o := decide(t, d, take); !o.Allowed || o.Used != 3 || o.Limit != 3 {
		t.Fatalf("take under the raised limit = %+v, want allowed at used 3", o)
	}
}
