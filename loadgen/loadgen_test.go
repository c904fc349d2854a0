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
