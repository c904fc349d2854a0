package rls_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"quotad/dispatch"
	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
	"quotad/rls"
	"quotad/rls/descriptors"
	"quotad/sidecar"
	"quotad/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait: it decides how long a broken test takes
// to fail, never whether a working one passes.
const waitTimeout = 20 * time.Second

// testPrefix is the key prefix of every dispatcher in these tests.
const testPrefix = "qt:"

// env is a service on a Unix socket, over a dispatcher on a real Redis,
// and a go-control-plane client of it.
type env struct {
	t      testing.TB
	url    string
	redis  *redistest.Server // nil on a Cluster
	st     *store.Store
	d      *dispatch.Dispatcher
	svc    *rls.Service
	srv    *rls.Server
	reg    *prometheus.Registry
	sock   string
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
}

// setup serves the descriptors file desc (YAML, one domain) and the
// policy file policies on a fresh redis-server.
func setup(t testing.TB, desc, policies string, opts ...func(*rls.ServiceOptions)) *env {
	t.Helper()
	r := redistest.Start(t)
	e := setupOn(t, r.URL(), desc, policies, opts...)
	e.redis = r
	return e
}

// setupOn is setup on the Redis (or Cluster) at url.
func setupOn(t testing.TB, url, desc, policies string, opts ...func(*rls.ServiceOptions)) *env {
	t.Helper()
	e := &env{t: t, url: url, reg: prometheus.NewRegistry()}
	var err error
	e.st, err = store.OpenStore(store.StoreOptions{RedisURL: url, Timeout: time.Second, ProbeInterval: 20 * time.Millisecond, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.st.Close)
	select {
	case <-e.st.Started():
	case <-time.After(waitTimeout):
		t.Fatal("the store did not start")
	}
	pc, err := policy.ParseConfig([]byte(policies))
	if err != nil {
		t.Fatalf("policies: %v", err)
	}
	cfg, err := descriptors.Parse("test.yaml", []byte(desc))
	if err != nil {
		t.Fatalf("descriptors: %v", err)
	}
	so := rls.ServiceOptions{Config: cfg, Registry: e.reg, Logger: zaptest.NewLogger(t)}
	for _, o := range opts {
		o(&so)
	}
	e.d = dispatch.New(dispatch.Options{Store: e.st, Config: pc, KeyPrefix: testPrefix, Registry: e.reg, Logger: zaptest.NewLogger(t), Tracer: so.Tracer})
	t.Cleanup(e.d.Close)
	so.Dispatcher = e.d
	e.svc = rls.NewService(so)
	e.srv = rls.NewServer(e.svc, zaptest.NewLogger(t))
	dir, err := os.MkdirTemp("", "qr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e.sock = filepath.Join(dir, "rls.sock")
	l, err := sidecar.Listen(e.sock, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Serve(l)
	e.srv.Serving(true)
	t.Cleanup(e.srv.Stop)
	e.conn, err = grpc.NewClient("unix://"+e.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.conn.Close() })
	e.client = rlsv3.NewRateLimitServiceClient(e.conn)
	return e
}

// call sends req and fails the test on an error.
func (e *env) call(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	e.t.Helper()
	resp, err := e.callErr(req)
	if err != nil {
		e.t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	return resp
}

func (e *env) callErr(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(e.t.Context(), waitTimeout)
	defer cancel()
	return e.client.ShouldRateLimit(ctx, req)
}

// take is the socket's take of cost on policy and subject, through the
// same dispatcher: what an app's {"op":"take",...} line asks.
func (e *env) take(pol, subject string, cost int64) dispatch.Outcome {
	e.t.Helper()
	req := &protocol.Request{Op: protocol.OpTake, Policy: pol, Subject: subject, Cost: cost}
	done := make(chan struct{})
	var dec dispatch.Decision
	dec.Done = func() { close(done) }
	if _, decided := e.d.Prepare(req, &dec); !decided {
		e.d.Run(&dec)
	}
	select {
	case <-done:
	case <-time.After(waitTimeout):
		e.t.Fatal("the take was not decided")
	}
	return dec.Out
}

// keys are the keys in the Redis of a standalone env.
func (e *env) keys() []string {
	e.t.Helper()
	ks, err := e.redis.Do(e.t, "KEYS", "*").AsStrSlice()
	if err != nil {
		e.t.Fatal(err)
	}
	return ks
}

// request is a request of domain with one descriptor per entry list;
// each entry list is key, value, key, value...
func request(domain string, descs ...[]string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for _, kv := range descs {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// hits sets descriptor i's own hits_addend.
func hits(req *rlsv3.RateLimitRequest, i int, n uint64) *rlsv3.RateLimitRequest {
	req.Descriptors[i].HitsAddend = wrapperspb.UInt64(n)
	return req
}

// codes are the statuses' codes, in order.
func statusCodes(resp *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	var out []rlsv3.RateLimitResponse_Code
	for _, s := range resp.GetStatuses() {
		out = append(out, s.GetCode())
	}
	return out
}

// remaining are the statuses' limit_remaining, in order.
func remaining(resp *rlsv3.RateLimitResponse) []uint32 {
	var out []uint32
	for _, s := range resp.GetStatuses() {
		out = append(out, s.GetLimitRemaining())
	}
	return out
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)
