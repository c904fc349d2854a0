package integration_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/limits"
)

const calendarConfig = `
policies:
  daily:
    algorithm: calendar
    limit: 5
    period: day
    time_zone: Europe/Berlin
  weekly:
    algorithm: calendar
    limit: 2
    period: week
    week_start: sunday
    jitter: 1h
`

// calendarCallers sends one take per connection at once and counts the
// allowed ones: the calendar window never admits more than its limit.
func calendarCallers(t *testing.T, p *sidecarProc, request string, callers int) int {
	t.Helper()
	conns := make([]*lineConn, callers)
	for i := range conns {
		conns[i] = p.dial(t)
	}
	replies := make([]reply, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { replies[i] = conns[i].do(fmt.Sprintf(request, i)) })
	}
	wg.Wait()
	allowed := 0
	for i, rep := range replies {
		if !rep.ok() {
			t.Fatalf("caller %d got %s", i, rep)
		}
		if rep.flag(t, "allowed") {
			allowed++
		}
	}
	return allowed
}

// The calendar algorithm through the built binary and its CLI, on Redis
// and on the embedded store: concurrent callers, replays, the CLI flags,
// and the keys it leaves, each named by its period and living until the
// period's end.
func TestCalendarThroughTheBinary(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(calendarConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, store := range []string{"redis", "embedded"} {
		t.Run(store, func(t *testing.T) {
			var r *redistest.Server
			url := ""
			if store == "redis" {
				r = redistest.Start(t)
				url = r.URL()
			}
			p := startSidecar(t, url, "--config", cfg)
			began := time.Now()
			if n := calendarCallers(t, p, `{"op":"take","subject":"u","policy":"daily","request_id":"d-%d"}`, 16); n != 5 {
				t.Fatalf("%d of 16 callers allowed under a daily limit of 5", n)
			}
			if n := calendarCallers(t, p, `{"op":"take","subject":"v","algorithm":"calendar","limit":3,"period":"month","time_zone":"Asia/Shanghai","request_id":"m-%d"}`, 8); n != 3 {
				t.Fatalf("%d of 8 callers allowed under an inline monthly limit of 3", n)
			}
			// A retry of an accepted id is a replay.
			c := p.dial(t)
			rep := c.do(`{"op":"take","subject":"u","policy":"daily","request_id":"d-0"}`)
			if rep.flag(t, "allowed") && !rep.flag(t, "replay") {
				t.Fatalf("retry = %s, want a replay or the same denial", rep)
			}

			// The CLI's flags make the inline form.
			out, stderr, code := p.cli(t, "take", "--algorithm", "calendar", "--limit", "2", "--period", "week",
				"--time-zone", "Asia/Shanghai", "--week-start", "sunday", "--cost", "2", "w")
			if code != 0 {
				t.Fatalf("quotad take: exit %d, %s", code, stderr)
			}
			wantTake(t, mustParse(t, out), true, false, 2, 2)
			out, _, code = p.cli(t, "take", "--algorithm", "calendar", "--limit", "2", "--period", "week",
				"--time-zone", "Asia/Shanghai", "--week-start", "sunday", "--exit-code", "w")
			if code != 2 {
				t.Fatalf("denied take exits %d, want %d: %s", code, 2, out)
			}
			shanghai, _ := time.LoadLocation("Asia/Shanghai")
			_, end := limits.CalendarWindow{Period: "week", TimeZone: "Asia/Shanghai", WeekStart: time.Sunday}.Bounds(time.Now().In(shanghai))
			if got := mustParse(t, out).num(t, "retry_after_ms"); got <= 0 || got > time.Until(end).Milliseconds()+1000 {
				t.Fatalf("retry_after_ms = %d, want the time to the week's end %v", got, end)
			}
			out, _, _ = p.cli(t, "peek", "--algorithm", "calendar", "--limit", "2", "--period", "week",
				"--time-zone", "Asia/Shanghai", "--week-start", "sunday", "w")
			wantPeek(t, mustParse(t, out), 2, 2)
			_, stderr, code = p.cli(t, "take", "--algorithm", "calendar", "--limit", "2", "--period", "day", "--time-zone", "Mars/Base", "w")
			if code == 0 || !strings.Contains(stderr, "time_zone") {
				t.Fatalf("a bad zone: exit %d, %s", code, stderr)
			}

			if r == nil {
				return
			}
			berlin, _ := time.LoadLocation("Europe/Berlin")
			start, end := limits.CalendarWindow{Period: "day", TimeZone: "Europe/Berlin"}.Bounds(time.Now().In(berlin))
			key := fmt.Sprintf("%scal:{p:daily:u}:%d", p.prefix, start.UnixMilli())
			// The TTL counts from Redis's clock at the script's PEXPIRE, a
			// moment after the TIME it was computed from.
			if got, want := redisInt(t, r, "PEXPIRETIME", key), end.UnixMilli()+1000; got < want-1 || got > want+time.Since(began).Milliseconds() {
				t.Fatalf("PEXPIRETIME %s = %d, want the day's end %d plus a second", key, got, end.UnixMilli())
			}
			assertKeysHaveTTL(t, r, p.prefix)
		})
	}
}

// A Redis Cluster run: subjects spread over every master, each decided in
// its own slot, with exact counts and every key with a TTL.
func TestCalendarOnCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	// As the documented ACL user (docs/redis.md): the calendar needs no
	// more than the other algorithms.
	addACLUser(t, append(c.Masters, c.Replicas...)...)
	p := launchSidecarEnv(t, socketPath(t), strings.Replace(c.URL(), "redis://", "redis://quotad@", 1), []string{"QUOTAD_REDIS_PASSWORD=" + aclPassword})
	p.waitReady(t)
	perMaster := map[*redistest.Server]int{}
	conn := p.dial(t)
	for i := range 30 {
		subject := fmt.Sprintf("user-%d", i)
		perMaster[c.Owner(t, keySlot(fmt.Sprintf("%scal:{i:%s}", p.prefix, subject)))]++
		for j := range 4 {
			rep := conn.do(fmt.Sprintf(`{"op":"take","subject":%q,"algorithm":"calendar","limit":3,"period":"day","time_zone":"Asia/Shanghai","request_id":"r%d"}`, subject, j))
			if !rep.ok() || rep.flag(t, "allowed") != (j < 3) {
				t.Fatalf("take %d of %s = %s", j, subject, rep)
			}
		}
		rep := conn.do(fmt.Sprintf(`{"op":"peek","subject":%q,"algorithm":"calendar","limit":3,"period":"day","time_zone":"Asia/Shanghai"}`, subject))
		if !rep.ok() || rep.num(t, "used") != 3 {
			t.Fatalf("peek of %s = %s", subject, rep)
		}
	}
	if len(perMaster) != 3 {
		t.Fatalf("subjects on %d masters, want all 3", len(perMaster))
	}
	for _, m := range c.Masters {
		if len(scanKeys(t, m, p.prefix)) == 0 {
			t.Errorf("no calendar key on master %s", m.Addr())
		}
		assertKeysHaveTTL(t, m, p.prefix)
	}
	wantNoACLDenials(t, append(c.Masters, c.Replicas...)...)
}
