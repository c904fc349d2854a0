package sidecar

import (
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/protocol"
)

const calendarPolicies = `
policies:
  daily:
    algorithm: calendar
    limit: 3
    period: day
    time_zone: Asia/Shanghai
  weekly:
    algorithm: calendar
    limit: 2
    period: week
    week_start: sunday
    jitter: 1h
`

// The calendar algorithm behind every op, named and inline, on Redis and
// on the embedded store.
func TestCalendarDispatch(t *testing.T) {
	for _, store := range []string{"redis", "embedded"} {
		t.Run(store, func(t *testing.T) {
			url := ""
			if store == "redis" {
				url = redistest.Start(t).URL()
			}
			_, c := algorithmServer(t, openStore(t, url), calendarPolicies)
			ok := func(line string) protocol.Reply {
				t.Helper()
				r := c.call(line)
				if !r.OK {
					t.Fatalf("%s = %+v", line, r)
				}
				return r
			}
			before := time.Now()
			_, end := limits.CalendarWindow{Limit: 3, Period: "day", TimeZone: "Asia/Shanghai"}.Bounds(before)
			toEnd := end.Sub(before).Milliseconds()
			r := ok(`{"op":"take","subject":"u","policy":"daily","cost":2,"request_id":"a"}`)
			if !r.Allowed || r.Limit != 3 || r.Used != 2 || r.Remaining != 1 || r.ResetMS <= 0 || r.ResetMS > toEnd+1000 {
				t.Fatalf("calendar take = %+v, want used 2 and reset_ms about %d", r, toEnd)
			}
			if r := ok(`{"op":"take","subject":"u","policy":"daily","cost":2,"request_id":"a"}`); !r.Replay || r.Used != 2 {
				t.Fatalf("retry = %+v, want a replay", r)
			}
			checkCode(t, "changed cost", c.call(`{"op":"take","subject":"u","policy":"daily","cost":1,"request_id":"a"}`), protocol.CodeConflict)
			d := ok(`{"op":"take","subject":"u","policy":"daily","cost":2}`)
			if d.Allowed || d.Used != 2 || d.RetryAfterMS <= 0 || d.RetryAfterMS != d.ResetMS {
				t.Fatalf("take over the limit = %+v, want denied until the period's end", d)
			}
			checkCode(t, "cost above the limit", c.call(`{"op":"take","subject":"u","policy":"daily","cost":4}`), protocol.CodeInvalid)
			if p := ok(`{"op":"peek","subject":"u","policy":"daily"}`); p.Used != 2 || p.Remaining != 1 || p.ResetMS <= 0 {
				t.Fatalf("peek = %+v", p)
			}
			if p := ok(`{"op":"peek","subject":"nobody","policy":"weekly"}`); p.Used != 0 || p.Remaining != 2 || p.ResetMS <= 0 {
				t.Fatalf("peek of an unused week = %+v, want reset_ms to the week's end", p)
			}
			checkCode(t, "release", c.call(`{"op":"release","subject":"u","policy":"daily","request_id":"a"}`), protocol.CodeInvalid)

			inline := `{"op":"take","subject":"v","algorithm":"calendar","limit":1000,"period":"day","time_zone":"Asia/Shanghai"}`
			if r := ok(inline); !r.Allowed || r.Limit != 1000 || r.Used != 1 {
				t.Fatalf("inline calendar = %+v", r)
			}
			// Hong Kong's day starts when Shanghai's does: the same window,
			// under other limits.
			checkCode(t, "inline calendar of another zone", c.call(`{"op":"take","subject":"v","algorithm":"calendar","limit":1000,"period":"day","time_zone":"Asia/Hong_Kong"}`), protocol.CodePolicy)
			// Tokyo's day is another period, with a window of its own.
			if r := ok(`{"op":"take","subject":"v","algorithm":"calendar","limit":1000,"period":"day","time_zone":"Asia/Tokyo"}`); !r.Allowed || r.Used != 1 {
				t.Fatalf("inline calendar of another period = %+v, want its own window", r)
			}
			checkCode(t, "inline calendar of another limit", c.call(`{"op":"take","subject":"v","algorithm":"calendar","limit":999,"period":"day","time_zone":"Asia/Shanghai"}`), protocol.CodePolicy)
			for _, bad := range []string{
				`{"op":"take","subject":"v","algorithm":"calendar","limit":1,"period":"year"}`,
				`{"op":"take","subject":"v","algorithm":"calendar","limit":1,"period":"day","time_zone":"Nowhere/City"}`,
				`{"op":"take","subject":"v","algorithm":"calendar","limit":1,"period":"week","week_start":"someday"}`,
			} {
				checkCode(t, bad, c.call(bad), protocol.CodeInvalid)
			}
		})
	}
}

// Shadow mode, on_unavailable and the metrics' algorithm label work for
// the calendar through the dispatcher, as for every algorithm.
func TestCalendarShadowAndUnavailable(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts, c := algorithmServer(t, st, `
policies:
  trial:
    algorithm: calendar
    limit: 1
    period: month
    mode: shadow
  open:
    algorithm: calendar
    limit: 1
    period: day
    on_unavailable: allow
`)
	for i, wantReal := range []bool{true, false} {
		got := c.call(`{"op":"take","subject":"s","policy":"trial","request_id":"r` + string(rune('0'+i)) + `"}`)
		if !got.OK || !got.Allowed || !got.Shadow || got.ShadowAllowed != wantReal {
			t.Fatalf("shadow take %d = %+v, want allowed, shadow_allowed %v", i, got, wantReal)
		}
	}
	if n := metricValue(t, ts.Server, "quotad_decisions_total", map[string]string{"policy": "trial", "algorithm": "calendar", "result": "shadow_denied"}); n != 1 {
		t.Fatalf("shadow_denied of the calendar policy = %v, want 1", n)
	}
	// The keys are checked now: Redis stays down for the rest.
	redistest.AssertAllKeysHaveTTL(t, r.Client(t), testPrefix)
	r.Stop(t)
	waitFor(t, "the store to see redis down", func() bool { return !st.Up() })
	if got := c.call(`{"op":"take","subject":"s","policy":"open"}`); !got.OK || !got.Allowed || !got.Degraded {
		t.Fatalf("take with redis down = %+v, want allowed, degraded", got)
	}
}
