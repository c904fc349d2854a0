package integration_test

import (
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// TestCLISettle reserves 2000 tokens, settles the take at 1234, retries
// the settle, and tries another cost, through the CLI.
func TestCLISettle(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	limits := []string{"--limit", "100000", "--window-ms", "60000"}
	run := func(op string, args ...string) (reply, string, int) {
		t.Helper()
		stdout, stderr, code := sc.cli(t, op, append(append(append([]string(nil), limits...), args...), "tenant-7")...)
		if stdout == "" {
			return reply{}, stderr, code
		}
		return mustParse(t, stdout), stderr, code
	}

	rep, _, code := run("take", "--cost", "2000", "-r", "call-1")
	if code != 0 {
		t.Fatalf("take: exit %d", code)
	}
	wantTake(t, rep, true, false, 100000, 2000)

	settled := func(rep reply, replay bool, used int64) {
		t.Helper()
		if !rep.ok() || !rep.flag(t, "settled") || rep.flag(t, "replay") != replay || rep.num(t, "reserved") != 2000 ||
			rep.num(t, "used") != used || rep.num(t, "remaining") != 100000-used || rep.num(t, "retry_after_ms") != 0 {
			t.Fatalf("got %s, want settled, replay %v, reserved 2000, used %d", rep, replay, used)
		}
		wantResetWithin(t, rep, 60000)
	}
	rep, stderr, code := run("settle", "--cost", "1234", "--request-id", "call-1")
	if code != 0 || stderr != "" {
		t.Fatalf("settle: exit %d, stderr %q", code, stderr)
	}
	settled(rep, false, 1234)
	rep, _, code = run("settle", "--cost", "1234", "-r", "call-1")
	if code != 0 {
		t.Fatalf("settle again: exit %d", code)
	}
	settled(rep, true, 1234)

	rep, stderr, code = run("settle", "--cost", "1500", "-r", "call-1")
	if code == 0 || !strings.Contains(stderr, "CONFLICT") {
		t.Fatalf("settle at another cost: exit %d, stderr %q; want non-zero and CONFLICT", code, stderr)
	}
	wantError(t, rep, "CONFLICT")

	rep, _, code = run("settle", "--cost", "0", "-r", "call-2")
	if code != 0 || !rep.ok() || rep.flag(t, "settled") || rep.num(t, "used") != 1234 {
		t.Fatalf("settle of a take never accepted: exit %d, %s; want settled false", code, rep)
	}

	for _, missing := range [][]string{{"--cost", "1"}, {"-r", "call-1"}} {
		_, stderr, code := run("settle", missing...)
		if code == 0 || !strings.Contains(stderr, "Required flag") {
			t.Errorf("settle %v: exit %d, stderr %q; want the missing flag named", missing, code, stderr)
		}
	}
}

// TestSettleOnACluster settles takes of every algorithm on subjects spread
// over the masters of a Redis Cluster: each settle is one script on its
// key's slot (a calendar's three period keys share their hash tag), and a
// retry is a replay.
func TestSettleOnACluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	p := launchSidecar(t, socketPath(t), c.URL())
	p.waitReady(t)
	conn := p.dial(t)
	shapes := []string{
		`"limit":10,"window_ms":60000`,
		`"algorithm":"sliding_window","limit":10,"window_ms":60000`,
		`"algorithm":"calendar","limit":10,"period":"day"`,
		`"algorithm":"token_bucket","rate":1,"period_ms":3600000,"burst":10`,
	}
	masters := map[*redistest.Server]bool{}
	for i := range 12 {
		subject := "tenant-" + strconv.Itoa(i)
		masters[c.Owner(t, keySlot(inlineKey(p.prefix, subject)))] = true
		at := `"subject":"` + subject + `",` + shapes[i%len(shapes)] + `,"request_id":"job-1"`
		if r := conn.do(`{"op":"take",` + at + `,"cost":6}`); !r.ok() || !r.flag(t, "allowed") {
			t.Fatalf("take %s: %s", subject, r)
		}
		for n, replay := range []bool{false, true} {
			r := conn.do(`{"op":"settle",` + at + `,"cost":2}`)
			if !r.ok() || !r.flag(t, "settled") || r.flag(t, "replay") != replay || r.num(t, "used") != 2 || r.num(t, "reserved") != 6 {
				t.Fatalf("settle %d of %s: %s, want settled at used 2, replay %v", n, subject, r, replay)
			}
		}
	}
	if len(masters) < 2 {
		t.Fatalf("the subjects landed on %d master(s), want several", len(masters))
	}
	for _, m := range c.Masters {
		assertKeysHaveTTL(t, m, p.prefix)
	}
}
