package loadgen_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"quotad/loadgen"
	"quotad/protocol"
)

// fakeSidecar answers takes by a rule of the test's choosing and records
// the requests, so the load generator's counting and request shapes can be
// checked exactly. The sidecar itself is driven by the integration tests.
type fakeSidecar struct {
	path string
	l    net.Listener
	wg   sync.WaitGroup

	mu   sync.Mutex
	reqs []map[string]any
	n    int
}

func startFake(t *testing.T, answer func(n int, req map[string]any) []byte) *fakeSidecar {
	t.Helper()
	f := &fakeSidecar{path: filepath.Join(t.TempDir(), "s.sock")}
	l, err := net.Listen("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	f.l = l
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer nc.Close()
				sc := bufio.NewScanner(nc)
				for sc.Scan() {
					var req map[string]any
					if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
						t.Errorf("the load generator sent invalid JSON %q: %v", sc.Bytes(), err)
						return
					}
					f.mu.Lock()
					f.reqs = append(f.reqs, req)
					f.n++
					out := answer(f.n, req)
					f.mu.Unlock()
					if out == nil {
						return // hang up
					}
					if _, err := nc.Write(out); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); f.wg.Wait() })
	return f
}

// eachEngine runs test with every way the load generator can drive its
// connections on this platform.
func eachEngine(t *testing.T, test func(t *testing.T)) {
	for _, e := range loadgen.Engines() {
		t.Run(e.Name, func(t *testing.T) {
			e.Use(t)
			test(t)
		})
	}
}

func TestRunCountsEveryReplyByKind(t *testing.T) { eachEngine(t, testRunCountsEveryReplyByKind) }

func testRunCountsEveryReplyByKind(t *testing.T) {
	// Every fourth reply of each kind, in turn.
	f := startFake(t, func(n int, _ map[string]any) []byte {
		switch n % 4 {
		case 0:
			return protocol.AppendTake(nil, nil, protocol.TakeReply{Allowed: true, Limit: 5, Used: 1})
		case 1:
			return protocol.AppendTake(nil, nil, protocol.TakeReply{Allowed: false, Limit: 5, Used: 5})
		case 2:
			return protocol.AppendTake(nil, nil, protocol.TakeReply{Allowed: true, Replay: true, Limit: 5, Used: 1})
		}
		return protocol.AppendError(nil, nil, protocol.CodeUnavailable, "redis did not answer in time")
	})
	for _, inflight := range []int{1, 4} {
		t.Run(fmt.Sprintf("inflight=%d", inflight), func(t *testing.T) {
			checkCounts(t, f, inflight)
		})
	}
}

func checkCounts(t *testing.T, f *fakeSidecar, inflight int) {
	f.mu.Lock()
	before := f.n
	f.mu.Unlock()
	var progress bytes.Buffer
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Socket: f.path, Conns: 3, InFlight: inflight, Duration: 300 * time.Millisecond,
		Limit: 5, WindowMS: 1000, Progress: &progress, ProgressEvery: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	sent := f.n - before
	f.mu.Unlock()
	if res.Replies == 0 || res.Replies != int64(sent) {
		t.Fatalf("counted %d replies, the sidecar answered %d", res.Replies, sent)
	}
	if sum := res.Allowed + res.Denied + res.Replays + res.ErrorCount(); sum != res.Replies {
		t.Fatalf("allowed+denied+replay+errors = %d, replies %d", sum, res.Replies)
	}
	if res.Allowed == 0 || res.Denied == 0 || res.Replays == 0 || res.Errors[protocol.CodeUnavailable] == 0 || len(res.Errors) != 1 {
		t.Fatalf("every kind was answered, counted %+v", res)
	}
	if res.P50 <= 0 || res.P50 > res.P90 || res.P90 > res.P99 || res.P99 > res.P999 {
		t.Fatalf("latency percentiles out of order: %v %v %v %v", res.P50, res.P90, res.P99, res.P999)
	}
	if !strings.Contains(progress.String(), "decisions/s") {
		t.Fatalf("no progress line in %q", progress.String())
	}
	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"decisions/s", "p99.9", "allowed", "UNAVAILABLE"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunSendsTheConfiguredRequests(t *testing.T) {
	eachEngine(t, testRunSendsTheConfiguredRequests)
}

func testRunSendsTheConfiguredRequests(t *testing.T) {
	ok := protocol.AppendTake(nil, nil, protocol.TakeReply{Allowed: true, Limit: 9, Used: 1})
	f := startFake(t, func(int, map[string]any) []byte { return ok })
	_, err := loadgen.Run(context.Background(), loadgen.Config{
		Socket: f.path, Conns: 2, InFlight: 3, Duration: 100 * time.Millisecond,
		Subjects: 3, SubjectPrefix: "s-", Policy: "api", Cost: 2, RequestIDs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := map[string]bool{}
	for _, r := range f.reqs {
		if r["op"] != "take" || r["policy"] != "api" || r["cost"] != 2.0 || r["limit"] != nil {
			t.Fatalf("request %v", r)
		}
		if s, _ := r["subject"].(string); s != "s-0" && s != "s-1" && s != "s-2" {
			t.Fatalf("subject %q is not one of the 3 configured", s)
		}
		id, _ := r["request_id"].(string)
		if id == "" || ids[id] {
			t.Fatalf("request id %q missing or repeated", id)
		}
		ids[id] = true
	}
	if len(f.reqs) == 0 {
		t.Fatal("nothing was sent")
	}
}

func TestRunReportsALostConnection(t *testing.T) { eachEngine(t, testRunReportsALostConnection) }

func testRunReportsALostConnection(t *testing.T) {
	// Answers two requests, then hangs up on the third, which the load
	// generator is still waiting for.
	f := startFake(t, func(n int, _ map[string]any) []byte {
		if n > 2 {
			return nil
		}
		return protocol.AppendTake(nil, nil, protocol.TakeReply{Allowed: true, Limit: 5, Used: 1})
	})
	_, err := loadgen.Run(context.Background(), loadgen.Config{
		Socket: f.path, Conns: 1, InFlight: 4, Duration: 200 * time.Millisecond, Limit: 5, WindowMS: 1000,
	})
	if err == nil || !strings.Contains(err.Error(), "outstanding") {
		t.Fatalf("err = %v, want the lost replies reported", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []loadgen.Config{
		{Limit: 1, WindowMS: 1},
		{Socket: "x"},
		{Socket: "x", Policy: "p", Limit: 1, WindowMS: 1},
	} {
		if _, err := loadgen.Run(context.Background(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	_, err := loadgen.Run(context.Background(), loadgen.Config{Socket: filepath.Join(t.TempDir(), "none"), Limit: 1, WindowMS: 1})
	if err == nil || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("err = %v, want a connect error", err)
	}
}

func TestRunSendsEachAlgorithmsInlineLimits(t *testing.T) {
	eachEngine(t, testRunSendsEachAlgorithmsInlineLimits)
}

func testRunSendsEachAlgorithmsInlineLimits(t *testing.T) {
	ok := protocol.AppendTake(nil, nil, protocol.TakeReply{Allowed: true, Limit: 9, Used: 1})
	for _, c := range []struct {
		cfg  loadgen.Config
		want map[string]any // every field besides op, subject and request_id
	}{
		{loadgen.Config{Limit: 7, WindowMS: 1000}, map[string]any{"limit": 7.0, "window_ms": 1000.0}},
		{loadgen.Config{Algorithm: "fixed_window", Limit: 7, WindowMS: 1000, RequestIDs: true}, map[string]any{"limit": 7.0, "window_ms": 1000.0}},
		{loadgen.Config{Algorithm: "token_bucket", Rate: 5, PeriodMS: 1000}, map[string]any{"algorithm": "token_bucket", "rate": 5.0, "period_ms": 1000.0}},
		{loadgen.Config{Algorithm: "token_bucket", Rate: 5, PeriodMS: 1000, Burst: 20, Cost: 2, RequestIDs: true},
			map[string]any{"algorithm": "token_bucket", "rate": 5.0, "period_ms": 1000.0, "burst": 20.0, "cost": 2.0}},
		{loadgen.Config{Algorithm: "concurrency", Limit: 3, LeaseMS: 5000, RequestIDs: true}, map[string]any{"algorithm": "concurrency", "limit": 3.0, "lease_ms": 5000.0}},
		{loadgen.Config{Algorithm: "sliding_window", Limit: 7, WindowMS: 1000}, map[string]any{"algorithm": "sliding_window", "limit": 7.0, "window_ms": 1000.0}},
		{loadgen.Config{Algorithm: "calendar", Limit: 7, Period: "day"}, map[string]any{"algorithm": "calendar", "limit": 7.0, "period": "day"}},
		{loadgen.Config{Algorithm: "calendar", Limit: 7, Period: "week", TimeZone: "Asia/Shanghai", RequestIDs: true},
			map[string]any{"algorithm": "calendar", "limit": 7.0, "period": "week", "time_zone": "Asia/Shanghai"}},
	} {
		t.Run(fmt.Sprintf("%s ids=%v", c.cfg.Algorithm, c.cfg.RequestIDs), func(t *testing.T) {
			f := startFake(t, func(int, map[string]any) []byte { return ok })
			cfg := c.cfg
			cfg.Socket, cfg.Conns, cfg.InFlight, cfg.Duration = f.path, 2, 3, 100*time.Millisecond
			if _, err := loadgen.Run(context.Background(), cfg); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.reqs) == 0 {
				t.Fatal("nothing was sent")
			}
			for _, r := range f.reqs {
				// The sidecar's own decoder must accept every request.
				line, _ := json.Marshal(r)
				var req protocol.Request
				if err := protocol.Decode(line, &req); err != nil {
					t.Fatalf("request %s: %v", line, err)
				}
				if _, has := r["request_id"]; has != cfg.RequestIDs {
					t.Fatalf("request %s: request_id present %v, want %v", line, has, cfg.RequestIDs)
				}
				got := map[string]any{}
				for k, v := range r {
					if k != "op" && k != "subject" && k != "request_id" {
						got[k] = v
					}
				}
				if fmt.Sprint(got) != fmt.Sprint(c.want) {
					t.Fatalf("request %s: fields %v, want %v", line, got, c.want)
				}
			}
		})
	}
}

func TestConfigErrorsOfTheAlgorithms(t *testing.T) {
	for _, c := range []loadgen.Config{
		{Algorithm: "leaky_bucket", Limit: 1, WindowMS: 1},
		{Limit: 1, WindowMS: 1, Rate: 1},
		{Algorithm: "token_bucket", Rate: 1},
		{Algorithm: "token_bucket", Rate: 1, PeriodMS: 1, WindowMS: 1},
		{Algorithm: "token_bucket", Rate: 1, PeriodMS: 1, Burst: -1},
		{Algorithm: "concurrency", Limit: 1, LeaseMS: 1},
		{Algorithm: "concurrency", Limit: 1, LeaseMS: 1, RequestIDs: true, Cost: 2},
		{Algorithm: "concurrency", Limit: 1, WindowMS: 1, RequestIDs: true},
		{Policy: "p", Algorithm: "token_bucket"},
		{Policy: "p", Rate: 1, PeriodMS: 1},
		{Limit: 1, WindowMS: 1, Release: true, RequestIDs: true},
		{Algorithm: "concurrency", Limit: 1, LeaseMS: 1, Release: true},
		{Algorithm: "sliding_window", Limit: 1},
		{Algorithm: "calendar", Limit: 1},
		{Algorithm: "calendar", Limit: 1, Period: "day", WindowMS: 1},
		{Limit: 1, WindowMS: 1, Period: "day"},
	} {
		c.Socket = filepath.Join(t.TempDir(), "none")
		_, err := loadgen.Run(context.Background(), c)
		if err == nil || strings.Contains(err.Error(), "connect") {
			t.Errorf("%+v: err = %v, want the config refused before connecting", c, err)
		}
	}
}

func TestRunReleasesEveryGrantedLease(t *testing.T) { eachEngine(t, testRunReleasesEveryGrantedLease) }

func testRunReleasesEveryGrantedLease(t *testing.T) {
	granted := map[string]bool{} // under the fake's lock
	var takes, releases int
	f := startFake(t, func(n int, req map[string]any) []byte {
		id, _ := req["request_id"].(string)
		key := fmt.Sprint(req["subject"], "/", id)
		if req["algorithm"] != "concurrency" || req["limit"] != 4.0 || req["lease_ms"] != 9000.0 || req["cost"] != nil {
			t.Errorf("request %v: not the configured concurrency limit", req)
		}
		switch req["op"] {
		case "take":
			takes++
			if n%3 == 0 {
				return protocol.AppendTake(nil, nil, protocol.TakeReply{Allowed: false, Limit: 4, Used: 4})
			}
			granted[key] = true
			return protocol.AppendTake(nil, nil, protocol.TakeReply{Allowed: true, Limit: 4, Used: 1, LeaseMS: 9000})
		case "release":
			releases++
			if !granted[key] {
				t.Errorf("release %v of a lease never granted, or released twice", req)
			}
			ok := granted[key]
			delete(granted, key)
			return protocol.AppendRelease(nil, nil, protocol.ReleaseReply{Released: ok, Limit: 4})
		}
		t.Errorf("request %v: op %v", req, req["op"])
		return nil
	})
	for _, inflight := range []int{1, 8} {
		t.Run(fmt.Sprintf("inflight=%d", inflight), func(t *testing.T) {
			f.mu.Lock()
			takes, releases = 0, 0
			f.mu.Unlock()
			const conns = 3
			res, err := loadgen.Run(context.Background(), loadgen.Config{
				Socket: f.path, Conns: conns, InFlight: inflight, Duration: 200 * time.Millisecond, Subjects: 5,
				Algorithm: "concurrency", Limit: 4, LeaseMS: 9000, RequestIDs: true, Release: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if res.Releases == 0 || res.Releases != int64(releases) || res.Released != res.Releases {
				t.Fatalf("%d release replies, %d freed a lease; the sidecar answered %d releases, each freeing one", res.Releases, res.Released, releases)
			}
			if res.Allowed+res.Denied != int64(takes) || res.Denied == 0 || res.Replies != int64(takes+releases) {
				t.Fatalf("result %+v; the sidecar answered %d takes and %d releases", res, takes, releases)
			}
			// Only the leases granted by the last replies of the run may be
			// left unreleased.
			if left := res.Allowed - res.Releases; left < 0 || left > conns*int64(inflight) {
				t.Fatalf("%d leases granted, %d released", res.Allowed, res.Releases)
			}
		})
	}
}

func TestRunSendsTakesOfChecks(t *testing.T) { eachEngine(t, testRunSendsTakesOfChecks) }

// A take of checks is counted by the take's own fields: a denied take
// whose first check was allowed is a denial.
func testRunSendsTakesOfChecks(t *testing.T) {
	allowed := []byte(`{"ok":true,"allowed":true,"replay":false,"retry_after_ms":0,"checks":[{"allowed":true,"replay":false,"limit":5,"used":1,"remaining":4,"reset_ms":100,"retry_after_ms":0},{"allowed":true,"replay":false,"limit":5,"used":1,"remaining":4,"reset_ms":100,"retry_after_ms":0}]}` + "\n")
	denied := []byte(`{"ok":true,"allowed":false,"replay":false,"retry_after_ms":100,"checks":[{"allowed":true,"replay":false,"limit":5,"used":1,"remaining":4,"reset_ms":100,"retry_after_ms":0},{"allowed":false,"replay":false,"limit":5,"used":5,"remaining":0,"reset_ms":100,"retry_after_ms":100}]}` + "\n")
	f := startFake(t, func(n int, _ map[string]any) []byte {
		if n%2 == 0 {
			return denied
		}
		return allowed
	})
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Socket: f.path, Conns: 2, InFlight: 3, Duration: 100 * time.Millisecond,
		Subjects: 4, SubjectPrefix: "s-", Checks: 2, Algorithm: "calendar", Limit: 5, Period: "minute", RequestIDs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replies == 0 || res.Allowed+res.Denied != res.Replies || res.Denied != res.Replies/2 || res.Replays != 0 {
		t.Fatalf("%d replies: %d allowed, %d denied, %d replays; want half of each, no replay", res.Replies, res.Allowed, res.Denied, res.Replays)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.reqs {
		line, _ := json.Marshal(r)
		var req protocol.Request
		if err := protocol.Decode(line, &req); err != nil {
			t.Fatalf("request %s: %v", line, err)
		}
		checks, _ := r["checks"].([]any)
		if r["op"] != "take" || r["subject"] != nil || len(checks) != 2 || r["request_id"] == nil {
			t.Fatalf("request %s: want a take of 2 checks with a request id", line)
		}
		for i, c := range checks {
			c := c.(map[string]any)
			s, _ := c["subject"].(string)
			if !strings.HasPrefix(s, fmt.Sprintf("s-%d-", i)) || c["algorithm"] != "calendar" || c["period"] != "minute" || c["limit"] != 5.0 {
				t.Fatalf("request %s: check %d is %v", line, i, c)
			}
		}
	}
	for _, bad := range []loadgen.Config{
		{Checks: 1, Limit: 1, WindowMS: 1},
		{Checks: -2, Limit: 1, WindowMS: 1},
		{Checks: 2, Algorithm: "concurrency", Limit: 1, LeaseMS: 1, RequestIDs: true, Release: true},
	} {
		bad.Socket = f.path
		if _, err := loadgen.Run(context.Background(), bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
