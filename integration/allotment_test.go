package integration_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
)

// The guarantees of allotments (docs/allotments.md), each against one real
// redis-server shared by several `quotad serve` processes, as the sidecars
// of several pods share it: no more admitted than the limit across them,
// nothing lost once they are idle or drained, a return applied once when
// it is retried, little wasted under contention, a killed sidecar losing
// at most what it held, and reserved units handed out while Redis is
// unreachable. The figures each test measured are logged for the closing
// note of the change; none of them is a timing assertion.

// allotPolicies are the policies of every test below. The windows are
// short so that a test sees several of them in a few seconds; the limits
// of the *-lose policies are out of reach, so that what a sidecar holds
// when its load stops is unused and must go back.
const allotPolicies = `
policies:
  fw:
    limit: 1000
    window: 2s
    allotment: {}
  cal:
    algorithm: calendar
    limit: 1000
    period: minute
    time_zone: UTC
    jitter: 59999ms
    allotment: {}
  sw:
    algorithm: sliding_window
    limit: 1000
    window: 1s
    allotment: {}
  tb:
    algorithm: token_bucket
    rate: 500
    period: 1s
    burst: 200
    allotment: {}
  fw-lose:
    limit: 1000000
    window: 1m
    allotment: {idle: 250ms}
  cal-lose:
    algorithm: calendar
    limit: 1000000
    period: day
    time_zone: UTC
    allotment: {idle: 250ms}
  sw-lose:
    algorithm: sliding_window
    limit: 1000000
    window: 1m
    allotment: {idle: 250ms}
  tb-lose:
    algorithm: token_bucket
    rate: 360
    period: 1h
    burst: 100000
    allotment: {idle: 250ms}
  sw-edge:
    algorithm: sliding_window
    limit: 1000000
    window: 2s
    allotment: {idle: 250ms}
  fw-hold:
    limit: 1000000
    window: 1m
    allotment: {idle: 1m}
  cal-hold:
    algorithm: calendar
    limit: 1000000
    period: day
    time_zone: UTC
    allotment: {idle: 1m}
  sw-hold:
    algorithm: sliding_window
    limit: 1000000
    window: 1m
    allotment: {idle: 1m}
  tb-hold:
    algorithm: token_bucket
    rate: 360
    period: 1h
    burst: 100000
    allotment: {idle: 1m}
  fw-kill:
    limit: 1000000
    window: 5s
    allotment: {idle: 1m}
  fw-out:
    limit: 1000000
    window: 1m
    on_unavailable: deny
    allotment: {idle: 1m}
`

// Metrics of allotments, as /metrics names them.
const (
	metricHeld     = "quotad_allotment_units_held"
	metricReserved = "quotad_allotment_units_reserved_total"
	metricReturned = "quotad_allotment_units_returned_total"
	metricLost     = "quotad_allotment_units_lost_total"
	metricLocal    = "quotad_allotment_local_decisions_total"
)

const (
	allotSidecars = 4 // sidecars sharing one Redis
	allotConns    = 4 // connections taking one at a time, per sidecar
)

// allotSidecar is a sidecar of a group sharing a key prefix, with its
// /metrics.
type allotSidecar struct {
	*sidecarProc
	http string
}

// metric reads the sum of every series of name for policy (and of series
// without a policy label) from the sidecar's /metrics; a metric without a
// series yet (a counter never added to) is 0, so the tests check that the
// figures they read add up, not only that they are 0.
func (s *allotSidecar) metric(t *testing.T, name, policy string) float64 {
	t.Helper()
	code, body := httpGet(t, "http://"+s.http+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	return metricSum(body, name, policy)
}

// metricSum adds the values of name's series in a Prometheus text
// exposition, leaving out those labelled with another policy.
func metricSum(body, name, policy string) float64 {
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if i := strings.LastIndexByte(line, '}'); i >= 0 {
			series, value, ok = line[:i+1], strings.TrimSpace(line[i+1:]), true
		}
		if !ok {
			continue
		}
		n, labels, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		if strings.Contains(labels, `policy="`) && !strings.Contains(labels, `policy="`+policy+`"`) {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			continue
		}
		sum += f
	}
	return sum
}

// sumMetric is metric summed over sidecars.
func sumMetric(t *testing.T, sidecars []*allotSidecar, name, policy string) float64 {
	t.Helper()
	var sum float64
	for _, s := range sidecars {
		sum += s.metric(t, name, policy)
	}
	return sum
}

// allotGroup is a redis-server (or a fault proxy in front of it) and n
// sidecars on it sharing one key prefix, each with the policies above.
type allotGroup struct {
	redis    *redistest.Server
	proxy    *redistest.FaultProxy // nil: the sidecars talk to redis directly
	prefix   string
	sidecars []*allotSidecar
}

func startAllotGroup(t *testing.T, n int, viaProxy bool, extraArgs ...string) *allotGroup {
	t.Helper()
	g := &allotGroup{redis: redistest.Start(t), prefix: keyPrefix(t)}
	url := g.redis.URL()
	if viaProxy {
		g.proxy = redistest.StartFaultProxy(t, g.redis.Addr())
		url = g.proxy.URL()
	}
	cfg := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(cfg, []byte(allotPolicies), 0o600); err != nil {
		t.Fatal(err)
	}
	for range n {
		addr := freeAddr(t)
		args := append([]string{"--config", cfg, "--key-prefix", g.prefix, "--http-addr", addr}, extraArgs...)
		p := launchSidecar(t, socketPath(t), url, args...)
		p.prefix = g.prefix
		g.sidecars = append(g.sidecars, &allotSidecar{sidecarProc: p, http: addr})
	}
	for _, s := range g.sidecars {
		s.waitReady(t)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			assertKeysHaveTTL(t, g.redis, g.prefix)
		}
	})
	return g
}

// admit is one allowed take as its caller saw it: sent and answered when,
// by which sidecar, and the window it says it counted in.
type admit struct {
	sent, recv time.Time
	sidecar    int
	local      bool
	resetMS    int64
}

// offered is what the callers of offer saw.
type offered struct {
	admits   []admit // in order of recv
	denials  []admit // the denied takes, as admits are recorded
	denied   int64
	degraded int64 // answers of on_unavailable, allowed or not
	local    int64 // answers marked "local":true, allowed or not
	replies  int64
	errors   []string // the first error replies and failures
	started  time.Time
	stopped  time.Time // when the callers were told to stop
}

func (o offered) admitted() int64 { return int64(len(o.admits)) }

// admittedLocally is how many admits were answered from held units.
func (o offered) admittedLocally() int64 {
	var n int64
	for _, a := range o.admits {
		if a.local {
			n++
		}
	}
	return n
}

// offerFor has allotConns callers on each sidecar take line (a take of
// cost 1), one at a time each, on connections of their own, for d.
// Callers ask as fast as the sidecars answer: more than any limit here
// admits.
func offerFor(t *testing.T, sidecars []*allotSidecar, line string, d time.Duration) offered {
	t.Helper()
	type caller struct {
		c       *lineConn
		sidecar int
		o       offered
	}
	var callers []*caller
	for i, s := range sidecars {
		for range allotConns {
			callers = append(callers, &caller{c: s.dial(t), sidecar: i})
		}
	}
	res := offered{started: time.Now()}
	stop := make(chan struct{})
	var stopped time.Time
	timer := time.AfterFunc(d, func() {
		stopped = time.Now()
		close(stop)
	})
	defer timer.Stop()
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent := time.Now()
				r, err := c.c.roundTrip(line)
				recv := time.Now()
				c.o.replies++
				switch {
				case err != nil:
					c.o.errors = append(c.o.errors, err.Error())
					return
				case !r.ok():
					if len(c.o.errors) < 5 {
						c.o.errors = append(c.o.errors, r.String())
					}
					continue
				}
				if local, _ := r.fields["local"].(bool); local {
					c.o.local++
				}
				if degraded, _ := r.fields["degraded"].(bool); degraded {
					c.o.degraded++
					continue
				}
				if allowed, _ := r.fields["allowed"].(bool); !allowed {
					c.o.denied++
					c.o.denials = append(c.o.denials, admit{sent: sent, recv: recv, sidecar: c.sidecar})
					continue
				}
				local, _ := r.fields["local"].(bool)
				var resetMS int64
				if n, ok := r.fields["reset_ms"].(json.Number); ok {
					resetMS, _ = n.Int64()
				}
				c.o.admits = append(c.o.admits, admit{sent: sent, recv: recv, sidecar: c.sidecar, local: local, resetMS: resetMS})
			}
		})
	}
	wg.Wait()
	// Every caller saw stop closed, after stopped was written.
	res.stopped = stopped
	for _, c := range callers {
		res.admits = append(res.admits, c.o.admits...)
		res.denials = append(res.denials, c.o.denials...)
		res.denied += c.o.denied
		res.degraded += c.o.degraded
		res.local += c.o.local
		res.replies += c.o.replies
		res.errors = append(res.errors, c.o.errors...)
	}
	sort.Slice(res.admits, func(i, j int) bool { return res.admits[i].recv.Before(res.admits[j].recv) })
	if len(res.errors) > 0 {
		t.Errorf("%d errors while offering %s, the first: %s", len(res.errors), line, strings.Join(res.errors[:min(len(res.errors), 5)], "; "))
	}
	return res
}

func takeLine(policy, subject string) string {
	return fmt.Sprintf(`{"op":"take","subject":%q,"policy":%q}`, subject, policy)
}

// span is one window [start, end) in the caller's clock, which is Redis's:
// every process of these tests runs on one machine.
type span struct {
	start, end time.Time
	admitted   int64
	straddling int64 // admits sent before its start or answered after its end
	// offered is the takes answered within it, allowed or not, by sidecar.
	offered [allotSidecars]int64
}

// slack covers the millisecond rounding of the windows' edges as the
// tests learn them (Redis keeps expiries in whole ms, PTTL answers in
// whole ms, and the read takes a round trip).
const slack = 5 * time.Millisecond

// assign counts each admit in the window it counted in: the one its
// caller's round trip overlaps, or, for a round trip across an edge, the
// one whose end its reply's reset_ms names. An admit no window can hold
// (answered where no window of Redis was live) is returned, as a breach.
func assign(o offered, spans []*span) (outside []admit) {
	for _, s := range spans {
		for _, a := range append(o.admits[:len(o.admits):len(o.admits)], o.denials...) {
			if !a.recv.Before(s.start) && a.recv.Before(s.end) {
				s.offered[a.sidecar]++
			}
		}
	}
	for _, a := range o.admits {
		var cands []*span
		for _, s := range spans {
			if a.sent.Before(s.end.Add(slack)) && !a.recv.Before(s.start.Add(-slack)) {
				cands = append(cands, s)
			}
		}
		switch len(cands) {
		case 0:
			outside = append(outside, a)
			continue
		case 1:
			cands[0].admitted++
			continue
		}
		claimed := a.recv.Add(time.Duration(a.resetMS) * time.Millisecond)
		best := cands[0]
		for _, s := range cands[1:] {
			if absDur(s.end.Sub(claimed)) < absDur(best.end.Sub(claimed)) {
				best = s
			}
		}
		best.admitted++
		best.straddling++
	}
	return outside
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// watchWindows polls a fixed window's PTTL until stop is closed and
// returns every window it saw: a window's end is when it was read plus
// its PTTL, and it began window earlier.
func watchWindows(t *testing.T, r *redistest.Server, key string, window time.Duration, stop <-chan struct{}) <-chan []*span {
	out := make(chan []*span, 1)
	go func() {
		var spans []*span
		var rtts []time.Duration
		for {
			select {
			case <-stop:
				out <- spans
				return
			default:
			}
			t0 := time.Now()
			pttl, err := r.Do(t, "PTTL", key).AsInt64()
			t1 := time.Now()
			if err == nil && pttl >= 0 {
				// The end is within the round trip plus the PTTL; the
				// quickest round trip of a window places it best.
				rtt := t1.Sub(t0)
				end := t0.Add(rtt / 2).Add(time.Duration(pttl) * time.Millisecond)
				n := len(spans)
				switch {
				case n == 0 || end.Sub(spans[n-1].end) > window/2:
					spans = append(spans, &span{start: end.Add(-window), end: end})
					rtts = append(rtts, rtt)
				case rtt < rtts[n-1]:
					spans[n-1].start, spans[n-1].end, rtts[n-1] = end.Add(-window), end, rtt
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return out
}

// Several sidecars, each offered more than the limit by concurrent
// callers, never admit more than the limit together in any window: for
// the fixed, calendar and sliding windows and the token bucket. The fixed
// and calendar windows' full windows are at least 97% used: little is
// wasted by what the sidecars hold when a window ends.
func TestAllotmentsNeverAdmitMoreThanTheLimit(t *testing.T) {
	g := startAllotGroup(t, allotSidecars, false)
	// The windows' limit (the bucket's is below): each sidecar's callers
	// offer it several times over in a window, even with the race
	// detector.
	const limit = 1000

	t.Run("fixed window", func(t *testing.T) {
		const window = 2 * time.Second
		subject := "fw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		stop := make(chan struct{})
		windows := watchWindows(t, g.redis, luascript.FixedWindowKey(g.prefix, "fw", subject), window, stop)
		o := offerFor(t, g.sidecars, takeLine("fw", subject), 2*window+window/4)
		close(stop)
		spans := <-windows
		if len(spans) < 3 {
			t.Fatalf("saw %d windows in %v, want 3 or more", len(spans), 2*window+window/4)
		}
		outside := assign(o, spans)
		logWindows(t, "fixed window", o, spans)
		if len(outside) > 0 {
			t.Errorf("%d takes were admitted while no window was live, the first sent %v after the load began",
				len(outside), outside[0].sent.Sub(o.started))
		}
		full := 0
		for i, s := range spans {
			if s.admitted > limit {
				t.Errorf("window %d admitted %d, limit %d", i+1, s.admitted, limit)
			}
			// A window is full when the load ran until its end: the
			// subject is new, so the first window began at the load's
			// first take.
			if s.end.Before(o.stopped) {
				full++
				checkContended(t, i, s, limit)
			}
		}
		if full < 2 {
			t.Errorf("%d full windows, want 2", full)
		}
	})

	t.Run("calendar window", func(t *testing.T) {
		// A subject whose jittered minute ends 1.5 s to 2.5 s from now: the
		// load crosses one edge of the calendar.
		cal := limits.CalendarWindow{Limit: limit, Period: limits.PeriodMinute, TimeZone: "UTC", JitterMS: 59999}
		var subject string
		var edge time.Time
		for i := 0; subject == ""; i++ {
			s := "cal-" + strconv.Itoa(i)
			off := cal.Offset(s)
			_, end := cal.Bounds(time.Now().Add(-off))
			if until := time.Until(end.Add(off)); until > 1500*time.Millisecond && until < 2500*time.Millisecond {
				subject, edge = s, end.Add(off)
			}
		}
		o := offerFor(t, g.sidecars, takeLine("cal", subject), time.Until(edge)+2*time.Second)
		spans := []*span{{start: edge.Add(-time.Minute), end: edge}, {start: edge, end: edge.Add(time.Minute)}}
		outside := assign(o, spans)
		logWindows(t, "calendar window", o, spans)
		if len(outside) > 0 {
			t.Errorf("%d takes were admitted outside the two periods", len(outside))
		}
		for i, s := range spans {
			if s.admitted > limit {
				t.Errorf("period %d admitted %d, limit %d", i+1, s.admitted, limit)
			}
			// The load ran from the subject's first take in the first
			// period, and long enough in the second to offer it all.
			checkContended(t, i, s, limit)
		}
	})

	t.Run("sliding window", func(t *testing.T) {
		const window = time.Second
		subject := "sw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		o := offerFor(t, g.sidecars, takeLine("sw", subject), 3*window+window/4)
		checkSliding(t, o, limit, window)
	})

	t.Run("token bucket", func(t *testing.T) {
		const rate, burst = 500, 200
		subject := "tb-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		began := time.Now() // the bucket is full: nobody took from it yet
		o := offerFor(t, g.sidecars, takeLine("tb", subject), 3*time.Second)
		checkBucket(t, o, began, rate, time.Second, burst)
	})
}

// checkContended checks that a window in which every sidecar was offered
// more than the limit admitted at least 97% of it: little was left unused
// in what the sidecars held when it ended. A window some sidecar was
// offered less is reported, not checked: its callers were too slow to
// contend (a loaded machine), which says nothing of allotments.
func checkContended(t *testing.T, i int, s *span, limit int64) {
	t.Helper()
	for k, n := range s.offered {
		if n <= limit {
			t.Logf("window %d: sidecar %d was offered %d takes, not more than the limit %d: its use is not checked", i+1, k, n, limit)
			return
		}
	}
	if s.admitted < limit*97/100 {
		t.Errorf("window %d admitted %d of %d, each sidecar offered %v: want at least 97%%", i+1, s.admitted, limit, s.offered)
	}
}

// logWindows prints what each window admitted.
func logWindows(t *testing.T, what string, o offered, spans []*span) {
	t.Helper()
	var parts []string
	for _, s := range spans {
		parts = append(parts, fmt.Sprintf("%d (%d across an edge; offered by sidecar %v)", s.admitted, s.straddling, s.offered))
	}
	t.Logf("%s, %d sidecars x %d callers: admitted per window %s; %d denied, %d of %d replies local",
		what, allotSidecars, allotConns, strings.Join(parts, ", "), o.denied, o.local, o.replies)
}

// checkSliding checks the sliding window's own bound (docs/algorithms.md)
// at each admit: the previous period's count, weighted by the share of it
// still within the window, plus the current period's count up to that
// admit, is at most the limit. Periods are aligned to the clock. Only
// admits whose round trip lies within one period are counted, and the
// weight is read at the reply, its lowest: a breach of this weaker sum
// is a breach of the bound.
func checkSliding(t *testing.T, o offered, limit int64, window time.Duration) {
	t.Helper()
	w := window.Milliseconds()
	period := func(at time.Time) int64 { return at.UnixMilli() / w }
	counts := map[int64]int64{}
	across := 0
	var worst float64
	for _, a := range o.admits {
		k := period(a.sent)
		if period(a.recv) != k {
			across++
			continue
		}
		counts[k]++
		elapsed := a.recv.UnixMilli() - k*w
		est := float64(counts[k-1])*float64(w-elapsed)/float64(w) + float64(counts[k])
		worst = max(worst, est)
		if est > float64(limit) {
			t.Errorf("admit %v after the load began: estimate %.1f over limit %d (previous period %d, current %d)",
				a.recv.Sub(o.started), est, limit, counts[k-1], counts[k])
			return
		}
	}
	var keys []int64
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, strconv.FormatInt(counts[k], 10))
		if counts[k] > limit {
			t.Errorf("a period admitted %d, limit %d", counts[k], limit)
		}
	}
	t.Logf("sliding window, %d sidecars x %d callers: admitted per period %s (%d across an edge); highest estimate %.0f of %d; %d denied, %d of %d replies local",
		allotSidecars, allotConns, strings.Join(parts, ", "), across, worst, limit, o.denied, o.local, o.replies)
}

// checkBucket checks that from the moment the bucket was full, the admits
// never outran burst + rate * elapsed / period, counting each admit at
// its reply, and logs the most that any stretch between two admits took
// beyond its refill.
func checkBucket(t *testing.T, o offered, began time.Time, rate int64, period time.Duration, burst int64) {
	t.Helper()
	perNS := float64(rate) / float64(period)
	for i, a := range o.admits {
		bound := float64(burst) + perNS*float64(a.recv.Sub(began))
		if float64(i+1) > bound {
			t.Errorf("%d admitted %v after the bucket was full, more than burst + rate * elapsed / period = %.1f", i+1, a.recv.Sub(began), bound)
			return
		}
	}
	var beyond float64
	for i := 0; i < len(o.admits); i += max(len(o.admits)/200, 1) {
		for j := i; j < len(o.admits); j++ {
			beyond = max(beyond, float64(j-i+1)-perNS*float64(o.admits[j].recv.Sub(o.admits[i].sent)))
		}
	}
	elapsed := o.admits[len(o.admits)-1].recv.Sub(began)
	t.Logf("token bucket, %d sidecars x %d callers: admitted %d in %v, bound %.0f; most taken in a stretch beyond its refill %.0f (burst %d); %d denied, %d of %d replies local",
		allotSidecars, allotConns, len(o.admits), elapsed.Round(time.Millisecond), float64(burst)+perNS*float64(elapsed), beyond, burst, o.denied, o.local, o.replies)
}

// count reads what Redis counts for (policy, subject) the way its
// algorithm stores it (luascript/doc.go): a fixed window's used, the sum
// of a calendar's periods' used, a sliding window's two periods c and p,
// and a bucket's tokens taken, from its TAT. The bucket must refill a
// token in longer than the test has run since its first take (period /
// rate), so that no token came back.
func count(t *testing.T, r *redistest.Server, prefix, algorithm, policy, subject string) int64 {
	t.Helper()
	field := func(key, f string) int64 {
		s, err := r.Do(t, "HGET", key, f).ToString()
		if err != nil {
			return 0 // no key or no field: nothing counted
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("HGET %s %s = %q", key, f, s)
		}
		return n
	}
	switch algorithm {
	case "fixed_window":
		return field(luascript.FixedWindowKey(prefix, policy, subject), "used")
	case "calendar":
		var n int64
		for _, k := range scanKeys(t, r, luascript.CalendarKey(prefix, policy, subject)+":") {
			n += field(k, "used")
		}
		return n
	case "sliding_window":
		k := luascript.SlidingWindowKey(prefix, policy, subject)
		return field(k, "c") + field(k, "p")
	case "token_bucket":
		const tokenUS = 10 * 1000 * 1000 // tb-lose and tb-hold: 360 per hour
		k := luascript.TokenBucketKey(prefix, policy, subject)
		tat := field(k, "tat")
		if tat == 0 {
			return 0
		}
		now, err := r.Do(t, "TIME").AsStrSlice()
		if err != nil || len(now) != 2 {
			t.Fatalf("TIME: %v", err)
		}
		sec, _ := strconv.ParseInt(now[0], 10, 64)
		usec, _ := strconv.ParseInt(now[1], 10, 64)
		ahead := tat - (sec*1_000_000 + usec)
		if ahead <= 0 {
			return 0
		}
		return (ahead + tokenUS - 1) / tokenUS
	}
	t.Fatalf("count: no algorithm %q", algorithm)
	return 0
}

var allotAlgorithms = []struct{ name, policy string }{
	{"fixed_window", "fw"},
	{"calendar", "cal"},
	{"sliding_window", "sw"},
	{"token_bucket", "tb"},
}

// waitCount waits until Redis counts want for (policy, subject), and
// fails with what it counts after pollTimeout.
func waitCount(t *testing.T, r *redistest.Server, prefix, algorithm, policy, subject string, want int64) {
	t.Helper()
	deadline := time.Now().Add(pollTimeout)
	for {
		got := count(t, r, prefix, algorithm, policy, subject)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: Redis counts %d, %d were admitted (%+d)", policy, got, want, got-want)
		}
		time.Sleep(pollInterval)
	}
}

// waitHeld waits until no sidecar holds any unit of policy.
func waitHeld(t *testing.T, sidecars []*allotSidecar, policy string) {
	t.Helper()
	eventually(t, "every sidecar to give back what it held of "+policy, func() bool {
		return sumMetric(t, sidecars, metricHeld, policy) == 0
	})
}

// clearOfEdge waits, when a period of the given length (aligned to the
// clock, as a sliding window's and a UTC day are) ends within margin,
// until it has ended: units held across a period's end are the subject
// of a test of their own.
func clearOfEdge(period, margin time.Duration) {
	if end := time.Now().Truncate(period).Add(period); time.Until(end) < margin {
		time.Sleep(time.Until(end) + 10*time.Millisecond)
	}
}

// Nothing is lost: once every sidecar has been idle for the policy's
// idle, and after a graceful shutdown, which gives back what they hold,
// Redis counts exactly what was admitted, for every algorithm.
func TestAllotmentsLoseNothing(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		g := startAllotGroup(t, allotSidecars, false)
		for _, alg := range allotAlgorithms {
			policy := alg.policy + "-lose"
			clearOfEdge(time.Minute, 3*time.Second)  // sw-lose's periods
			clearOfEdge(24*time.Hour, 3*time.Second) // cal-lose's
			o := offerFor(t, g.sidecars, takeLine(policy, "s"), 400*time.Millisecond)
			local := o.admittedLocally()
			reserved := sumMetric(t, g.sidecars, metricReserved, policy)
			if reserved <= float64(local) || local == 0 {
				t.Fatalf("%s: %d admitted, %d of them locally, %v units reserved: want local answers, and units held when the load stopped",
					policy, o.admitted(), local, reserved)
			}
			waitHeld(t, g.sidecars, policy)
			waitCount(t, g.redis, g.prefix, alg.name, policy, "s", o.admitted())
			// The metrics say so too: what was reserved and not handed
			// out was returned.
			var returned, lost float64
			eventually(t, policy+"'s returns to be counted", func() bool {
				reserved = sumMetric(t, g.sidecars, metricReserved, policy)
				returned = sumMetric(t, g.sidecars, metricReturned, policy)
				lost = sumMetric(t, g.sidecars, metricLost, policy)
				return returned+lost >= reserved-float64(local)
			})
			t.Logf("%s idle: admitted %d (%d locally), reserved %.0f, returned %.0f, lost %.0f; Redis counts %d",
				alg.name, o.admitted(), local, reserved, returned, lost, count(t, g.redis, g.prefix, alg.name, policy, "s"))
			if lost != 0 || returned != reserved-float64(local) {
				t.Errorf("%s: reserved %v, handed out %d, returned %v, lost %v without a fault", policy, reserved, local, returned, lost)
			}
		}
	})
	// A sliding window's previous period counts in its estimate for a
	// window more. Units a sidecar held when their period ended can no
	// longer be handed out, and go back to that period: once every
	// sidecar has been idle, Redis counts exactly what was admitted.
	t.Run("sliding window across a period's end", func(t *testing.T) {
		g := startAllotGroup(t, allotSidecars, false)
		const window = 2 * time.Second
		// Start 600 ms before a period ends, stop 600 ms after, and count
		// before the next period ends.
		now := time.Now()
		end := now.Truncate(window).Add(window)
		if time.Until(end) < 600*time.Millisecond {
			end = end.Add(window)
		}
		time.Sleep(time.Until(end.Add(-600 * time.Millisecond)))
		o := offerFor(t, g.sidecars, takeLine("sw-edge", "s"), 1200*time.Millisecond)
		waitHeld(t, g.sidecars, "sw-edge")
		var before, after int64
		for _, a := range o.admits {
			if a.recv.Before(end) {
				before++
			} else {
				after++
			}
		}
		var returned, lost float64
		eventually(t, "sw-edge's returns to be counted", func() bool {
			reserved := sumMetric(t, g.sidecars, metricReserved, "sw-edge")
			returned = sumMetric(t, g.sidecars, metricReturned, "sw-edge")
			lost = sumMetric(t, g.sidecars, metricLost, "sw-edge")
			return returned+lost >= reserved-float64(o.admittedLocally())
		})
		got := count(t, g.redis, g.prefix, "sliding_window", "sw-edge", "s")
		t.Logf("sliding window across a period's end: admitted %d (%d before the end, %d after), returned %.0f, lost %.0f; Redis counts %d (%+d)",
			o.admitted(), before, after, returned, lost, got, got-o.admitted())
		if time.Now().After(end.Add(window)) {
			t.Fatalf("the count was read after the period following the load's ended: too late to compare")
		}
		if got != o.admitted() || lost != 0 {
			t.Errorf("Redis counts %d, %d were admitted (%+d), and the sidecars counted %v lost", got, o.admitted(), got-o.admitted(), lost)
		}
	})
	t.Run("drain", func(t *testing.T) {
		g := startAllotGroup(t, allotSidecars, false)
		admitted := map[string]int64{}
		held := map[string]float64{}
		// From the first load to the end of the drain, no period of
		// sw-hold or cal-hold ends.
		clearOfEdge(time.Minute, 6*time.Second)
		clearOfEdge(24*time.Hour, 6*time.Second)
		for _, alg := range allotAlgorithms {
			policy := alg.policy + "-hold"
			admitted[policy] = offerFor(t, g.sidecars, takeLine(policy, "s"), 300*time.Millisecond).admitted()
			held[policy] = sumMetric(t, g.sidecars, metricHeld, policy)
			if held[policy] <= 0 {
				t.Fatalf("%s: the sidecars hold nothing after its load; the drain would return nothing", policy)
			}
		}
		for _, s := range g.sidecars {
			s.signal(t, syscall.SIGTERM)
		}
		for _, s := range g.sidecars {
			if code := s.wait(t); code != 0 {
				t.Fatalf("quotad serve exited %d after SIGTERM:\n%s", code, s.out.String())
			}
		}
		for _, alg := range allotAlgorithms {
			policy := alg.policy + "-hold"
			got := count(t, g.redis, g.prefix, alg.name, policy, "s")
			t.Logf("%s drain: admitted %d, held %.0f at SIGTERM; Redis counts %d", alg.name, admitted[policy], held[policy], got)
			if got != admitted[policy] {
				t.Errorf("%s: after the drain Redis counts %d, %d were admitted (%+d)", policy, got, admitted[policy], got-admitted[policy])
			}
		}
	})
}

// A return whose reply is lost is applied once however often it is sent:
// the fault proxy holds the reply of a sidecar's return back until Redis
// has applied it, the test sends the same return again, as a retry would,
// and then resets the connection, so the sidecar never learns that its
// return was applied: it sends it again once Redis answers, and counts
// its units returned, not lost.
func TestAllotmentsReturnOnceWhenRetried(t *testing.T) {
	// A deadline longer than the test waits for the return to be applied:
	// the reset, not a timeout, ends the sidecar's first attempt.
	g := startAllotGroup(t, 1, true, "--redis-timeout", "10s")
	const policy, subject = "fw-lose", "s"
	key := luascript.FixedWindowKey(g.prefix, policy, subject)
	// A return on another subject first, so that Redis holds the
	// scripts before any reply is held back: the sidecar loads a script
	// when it first needs it.
	offerFor(t, g.sidecars, takeLine(policy, "warm"), 300*time.Millisecond)
	waitHeld(t, g.sidecars, policy)
	eventually(t, "the warm-up's return to be counted", func() bool {
		return sumMetric(t, g.sidecars, metricReturned, policy)+sumMetric(t, g.sidecars, metricLost, policy) > 0
	})
	returnedBefore, lostBefore := sumMetric(t, g.sidecars, metricReturned, policy), sumMetric(t, g.sidecars, metricLost, policy)
	o := offerFor(t, g.sidecars, takeLine(policy, subject), 300*time.Millisecond)
	held := sumMetric(t, g.sidecars, metricHeld, policy)
	if held <= 0 {
		t.Fatal("the sidecar holds nothing after the load; no return would be made")
	}
	// The reservation's record names what a return of it names: its
	// holder (the field a:<holder>) and its seq.
	var holder string
	var seq int64
	fields, err := g.redis.Do(t, "HGETALL", key).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	for f, v := range fields {
		if h, ok := strings.CutPrefix(f, "a:"); ok {
			s, _, _ := strings.Cut(v, ":")
			if holder != "" {
				t.Fatalf("two reservation records in %v, want the one sidecar's", fields)
			}
			holder = h
			if seq, err = strconv.ParseInt(s, 10, 64); err != nil {
				t.Fatalf("reservation record %s = %q", f, v)
			}
		}
	}
	if holder == "" {
		t.Fatalf("no reservation record in %v", fields)
	}

	// Replies from Redis stop reaching the sidecar; its return goes out
	// once it has been idle for 250ms, and Redis applies it.
	g.proxy.SetLatency(redistest.ToClient, time.Hour)
	waitCount(t, g.redis, g.prefix, "fixed_window", policy, subject, o.admitted())
	again, err := luascript.Return(t.Context(), g.redis.Client(t), "fixed_window",
		luascript.Args{Key: key, Cost: int64(held), RequestID: holder, Seq: seq})
	if err != nil || again != 0 {
		t.Fatalf("the return sent again gave back %d (%v), want 0: it was applied before", again, err)
	}
	g.proxy.SetLatency(redistest.ToClient, 0)
	g.proxy.Reset()
	waitHeld(t, g.sidecars, policy)
	var returned, lost float64
	eventually(t, "every unit held to be counted returned or lost", func() bool {
		returned = sumMetric(t, g.sidecars, metricReturned, policy) - returnedBefore
		lost = sumMetric(t, g.sidecars, metricLost, policy) - lostBefore
		return returned+lost >= held
	})
	got := count(t, g.redis, g.prefix, "fixed_window", policy, subject)
	t.Logf("return with its reply dropped, sent again: admitted %d, held %.0f; the sidecar counts %.0f returned, %.0f lost; Redis counts %d",
		o.admitted(), held, returned, lost, got)
	if got != o.admitted() {
		t.Errorf("Redis counts %d, %d were admitted (%+d): a return was applied twice", got, o.admitted(), got-o.admitted())
	}
	if returned != held || lost != 0 {
		t.Errorf("returned %v and lost %v of the %v held, want all returned", returned, lost, held)
	}
}

// A SIGKILLed sidecar loses at most what it held, and only until its
// window ends.
func TestAllotmentsKilledSidecarLosesAtMostWhatItHeld(t *testing.T) {
	g := startAllotGroup(t, allotSidecars, false)
	const policy, subject = "fw-kill", "s"
	o := offerFor(t, g.sidecars, takeLine(policy, subject), 300*time.Millisecond)
	victim := g.sidecars[0]
	held := victim.metric(t, metricHeld, policy)
	if held <= 0 {
		t.Fatal("the sidecar to kill holds nothing after the load; its kill would lose nothing")
	}
	victim.wantStatus = -1 // killed by a signal
	victim.signal(t, syscall.SIGKILL)
	victim.wait(t)
	for _, s := range g.sidecars[1:] {
		s.signal(t, syscall.SIGTERM)
	}
	for _, s := range g.sidecars[1:] {
		if code := s.wait(t); code != 0 {
			t.Fatalf("quotad serve exited %d after SIGTERM", code)
		}
	}
	key := luascript.FixedWindowKey(g.prefix, policy, subject)
	got := count(t, g.redis, g.prefix, "fixed_window", policy, subject)
	t.Logf("SIGKILL: admitted %d, the killed sidecar held %.0f; Redis counts %d, lost %d", o.admitted(), held, got, got-o.admitted())
	if got < o.admitted() || float64(got-o.admitted()) > held {
		t.Errorf("Redis counts %d, %d were admitted: lost %d, the killed sidecar held %v", got, o.admitted(), got-o.admitted(), held)
	}
	// What it held ends with the window.
	if pttl := redisInt(t, g.redis, "PTTL", key); pttl <= 0 || pttl > 5000 {
		t.Fatalf("PTTL %d: the window must end within its 5s", pttl)
	}
	eventually(t, "the window holding the lost units to end", func() bool {
		return redisInt(t, g.redis, "EXISTS", key) == 0
	})
}

// While Redis is unreachable, a sidecar still hands out the units it
// holds, each one once, and then answers as its policy's on_unavailable
// says (deny). Once Redis is back and the sidecars drain, Redis counts
// exactly what was admitted.
func TestAllotmentsHandOutHeldUnitsWhileRedisIsDown(t *testing.T) {
	for _, fault := range []string{"refuse", "blackhole"} {
		t.Run(fault, func(t *testing.T) {
			g := startAllotGroup(t, 2, true, "--redis-timeout", "300ms")
			const policy, subject = "fw-out", "s"
			o := offerFor(t, g.sidecars, takeLine(policy, subject), 300*time.Millisecond)
			var held []float64
			for i, s := range g.sidecars {
				held = append(held, s.metric(t, metricHeld, policy))
				if held[i] <= 0 {
					t.Fatalf("sidecar %d holds nothing after the load; it would have nothing to hand out", i)
				}
			}
			switch fault {
			case "refuse":
				if err := g.proxy.Refuse(true); err != nil {
					t.Fatal(err)
				}
				g.proxy.Reset()
			case "blackhole":
				g.proxy.Blackhole(true)
			}
			admitted := o.admitted()
			for i, s := range g.sidecars {
				c := s.dial(t)
				var local int64
				for {
					r := c.do(takeLine(policy, subject))
					if !r.ok() {
						t.Fatalf("sidecar %d, Redis down, after %d local answers: %s", i, local, r)
					}
					if d, _ := r.fields["degraded"].(bool); d {
						if r.flag(t, "allowed") {
							t.Fatalf("sidecar %d: on_unavailable deny answered %s", i, r)
						}
						break
					}
					if !r.flag(t, "allowed") || !r.flag(t, "local") {
						t.Fatalf("sidecar %d, Redis down: %s, want a local answer or on_unavailable's", i, r)
					}
					local++
				}
				for range 3 {
					if r := c.do(takeLine(policy, subject)); !r.ok() || r.fields["degraded"] != true || r.flag(t, "allowed") {
						t.Fatalf("sidecar %d, Redis down, its units handed out: %s, want on_unavailable's denial", i, r)
					}
				}
				t.Logf("%s: sidecar %d held %.0f when Redis went away and handed out %d", fault, i, held[i], local)
				if float64(local) != held[i] {
					t.Errorf("sidecar %d held %v units when Redis went away and handed out %d", i, held[i], local)
				}
				admitted += local
			}
			switch fault {
			case "refuse":
				if err := g.proxy.Refuse(false); err != nil {
					t.Fatal(err)
				}
			case "blackhole":
				g.proxy.Blackhole(false)
			}
			lost := sumMetric(t, g.sidecars, metricLost, policy)
			for _, s := range g.sidecars {
				s.signal(t, syscall.SIGTERM)
			}
			for _, s := range g.sidecars {
				if code := s.wait(t); code != 0 {
					t.Fatalf("quotad serve exited %d after SIGTERM", code)
				}
			}
			got := count(t, g.redis, g.prefix, "fixed_window", policy, subject)
			t.Logf("%s: admitted %d in all; Redis counts %d after the drain (%+d); the sidecars counted %.0f lost", fault, admitted, got, got-admitted, lost)
			// A refused connection sends nothing, so nothing reserved can be
			// unknown to the sidecars. Through a blackhole, a reservation
			// that timed out is applied once the link heals, and its units
			// are lost until the window ends, as any take whose outcome is
			// unknown may have been applied.
			if fault == "refuse" && got != admitted {
				t.Errorf("Redis counts %d, %d were admitted (%+d)", got, admitted, got-admitted)
			}
			if got < admitted {
				t.Errorf("Redis counts %d, fewer than the %d admitted", got, admitted)
			}
		})
	}
}
