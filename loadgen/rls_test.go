package loadgen_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"quotad/loadgen"
)

// fakeRLS answers ShouldRateLimit by a rule of the test's choosing and
// records the requests.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	answer func(n int) (rlsv3.RateLimitResponse_Code, error)

	mu   sync.Mutex
	reqs []*rlsv3.RateLimitRequest
}

func (f *fakeRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	n := len(f.reqs)
	f.mu.Unlock()
	code, err := f.answer(n)
	if err != nil {
		return nil, err
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

func startFakeRLS(t *testing.T, answer func(n int) (rlsv3.RateLimitResponse_Code, error)) (*fakeRLS, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rls.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRLS{answer: answer}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return f, path
}

func TestRunRLSCountsEveryAnswer(t *testing.T) {
	f, path := startFakeRLS(t, func(n int) (rlsv3.RateLimitResponse_Code, error) {
		switch n % 4 {
		case 0:
			return 0, status.Error(codes.Unavailable, "redis is down")
		case 1:
			return rlsv3.RateLimitResponse_OVER_LIMIT, nil
		}
		return rlsv3.RateLimitResponse_OK, nil
	})
	res, err := loadgen.RunRLS(context.Background(), loadgen.RLSConfig{
		Socket: path, Streams: 3, InFlight: 4, Duration: 100 * time.Millisecond,
		Domain: "bench", Keys: []string{"user", "tenant"}, Subjects: 5, SubjectPrefix: "s-",
	})
	// A quarter of the calls failed: the run says so, with what it counted.
	if err == nil || !strings.Contains(err.Error(), "redis is down") {
		t.Fatalf("err = %v, want the failed calls reported", err)
	}
	if res.Replies == 0 || res.Allowed+res.Denied+res.Errors["UNAVAILABLE"] != res.Replies || res.Errors["UNAVAILABLE"] == 0 || res.Denied == 0 || res.P50 <= 0 {
		t.Fatalf("%+v: want every reply counted as allowed, denied or UNAVAILABLE", res)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if int64(len(f.reqs)) != res.Replies {
		t.Errorf("%d requests served, %d replies counted", len(f.reqs), res.Replies)
	}
	for _, r := range f.reqs {
		if r.Domain != "bench" || len(r.Descriptors) != 2 || r.HitsAddend != 1 {
			t.Fatalf("request %v: want domain bench, 2 descriptors, 1 hit", r)
		}
		for i, d := range r.Descriptors {
			e := d.Entries
			if len(e) != 1 || e[0].Key != []string{"user", "tenant"}[i] || !strings.HasPrefix(e[0].Value, fmt.Sprintf("s-%d-", i)) {
				t.Fatalf("request %v: descriptor %d is %v", r, i, e)
			}
		}
	}
}

func TestRunRLSAllowedRun(t *testing.T) {
	_, path := startFakeRLS(t, func(int) (rlsv3.RateLimitResponse_Code, error) { return rlsv3.RateLimitResponse_OK, nil })
	res, err := loadgen.RunRLS(context.Background(), loadgen.RLSConfig{
		Socket: path, Duration: 50 * time.Millisecond, Domain: "bench", Keys: []string{"k"},
	})
	if err != nil || res.Replies == 0 || res.Allowed != res.Replies || res.Rate() <= 0 {
		t.Fatalf("%+v, %v: want every call allowed", res, err)
	}
}

func TestRunRLSConfigErrors(t *testing.T) {
	for _, c := range []loadgen.RLSConfig{
		{Domain: "d", Keys: []string{"k"}},
		{Socket: "x", Keys: []string{"k"}},
		{Socket: "x", Domain: "d"},
	} {
		if _, err := loadgen.RunRLS(context.Background(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	// No service on the socket: every call fails, and the run says so.
	res, err := loadgen.RunRLS(context.Background(), loadgen.RLSConfig{
		Socket: filepath.Join(t.TempDir(), "none"), Duration: 50 * time.Millisecond, Domain: "d", Keys: []string{"k"},
	})
	if err == nil || res.Errors["UNAVAILABLE"] == 0 {
		t.Fatalf("%+v, %v: want UNAVAILABLE counted and reported", res, err)
	}
}
