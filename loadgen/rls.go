package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"quotad/protocol"
)

// RLSConfig describes one load run against Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) on a Unix
// socket, as Envoy asks it: with go-control-plane's generated client, each
// stream an HTTP/2 connection of its own carrying InFlight calls at once.
// Zero values take the defaults noted.
type RLSConfig struct {
	Socket   string
	Streams  int           // HTTP/2 connections; default 1
	InFlight int           // calls each stream keeps outstanding; default 1
	Duration time.Duration // how long calls are made; default 10s
	Domain   string        // the request's domain; required
	// Keys gives every request one descriptor per key, of one entry: the
	// key, and SubjectPrefix, the key's index, "-" and a number below
	// Subjects chosen at random per descriptor. Required.
	Keys          []string
	Subjects      int    // default 1000
	SubjectPrefix string // default "bench-"
}

func (c *RLSConfig) defaults() error {
	c.Streams = max(c.Streams, 1)
	c.InFlight = max(c.InFlight, 1)
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Subjects <= 0 {
		c.Subjects = 1000
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = "bench-"
	}
	switch {
	case c.Socket == "":
		return errors.New("loadgen: a socket path is required")
	case c.Domain == "" || len(c.Keys) == 0:
		return errors.New("loadgen: a rate limit service request needs a domain and at least one descriptor key")
	}
	return nil
}

// rlsCallGrace is how long the calls in flight at the end of a run may
// take to finish.
const rlsCallGrace = 30 * time.Second

// rlsCaller is one goroutine's calls and what it counted.
type rlsCaller struct {
	allowed, denied, replies int64
	errors                   map[protocol.Code]int64
	lat                      histogram
	firstErr                 error
}

// RunRLS opens cfg.Streams connections to the rate limit service, keeps
// cfg.InFlight calls outstanding on each for cfg.Duration, and returns the
// counts: Allowed is an overall OK, Denied an overall OVER_LIMIT, Errors
// the failed calls by their gRPC code (UNAVAILABLE, INVALID_ARGUMENT ...).
// Every call is one reply, whatever it says.
func RunRLS(ctx context.Context, cfg RLSConfig) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	conns := make([]*grpc.ClientConn, 0, cfg.Streams)
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	for range cfg.Streams {
		// Each ClientConn is one HTTP/2 connection, as each of Envoy's
		// workers holds to the rate limit cluster.
		cc, err := grpc.NewClient("unix://"+cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return Result{}, fmt.Errorf("loadgen: connect to %s: %w", cfg.Socket, err)
		}
		cc.Connect()
		conns = append(conns, cc)
	}
	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer cancel()
	// The calls in flight when the run ends may finish, but a service that
	// stopped answering must not hold the run forever.
	callCtx, cancelCalls := context.WithDeadline(ctx, start.Add(cfg.Duration+rlsCallGrace))
	defer cancelCalls()
	callers := make([]*rlsCaller, cfg.Streams*cfg.InFlight)
	var wg sync.WaitGroup
	for i := range callers {
		c := &rlsCaller{errors: map[protocol.Code]int64{}}
		callers[i] = c
		client := rlsv3.NewRateLimitServiceClient(conns[i%cfg.Streams])
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(runCtx, callCtx, &cfg, client, uint64(i))
		}()
	}
	wg.Wait()
	res := Result{Elapsed: time.Since(start), Errors: map[protocol.Code]int64{}}
	var h histogram
	var errs []error
	for _, c := range callers {
		res.Replies += c.replies
		res.Allowed += c.allowed
		res.Denied += c.denied
		for code, n := range c.errors {
			res.Errors[code] += n
		}
		h.merge(&c.lat)
		if c.firstErr != nil && len(errs) < 3 {
			errs = append(errs, c.firstErr)
		}
	}
	res.P50, res.P90, res.P99, res.P999 = h.quantile(0.50), h.quantile(0.90), h.quantile(0.99), h.quantile(0.999)
	if res.ErrorCount() > 0 && res.ErrorCount()*100 >= res.Replies {
		// More than the odd failure: the run measured failures.
		return res, fmt.Errorf("loadgen: %d of %d calls failed: %w", res.ErrorCount(), res.Replies, errors.Join(errs...))
	}
	return res, nil
}

// run makes one call at a time until runCtx ends; a call in flight then
// finishes (under ctx), as a socket client reads its last replies.
func (c *rlsCaller) run(runCtx, ctx context.Context, cfg *RLSConfig, client rlsv3.RateLimitServiceClient, id uint64) {
	rng := rand.New(rand.NewPCG(id, uint64(time.Now().UnixNano())))
	req := &rlsv3.RateLimitRequest{Domain: cfg.Domain, HitsAddend: 1}
	prefixes := make([][]byte, len(cfg.Keys))
	for i, k := range cfg.Keys {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k}},
		})
		prefixes[i] = strconv.AppendInt([]byte(cfg.SubjectPrefix), int64(i), 10)
		prefixes[i] = append(prefixes[i], '-')
	}
	var buf []byte
	for runCtx.Err() == nil {
		for i, d := range req.Descriptors {
			buf = strconv.AppendUint(append(buf[:0], prefixes[i]...), rng.Uint64N(uint64(cfg.Subjects)), 10)
			d.Entries[0].Value = string(buf)
		}
		t0 := time.Now()
		resp, err := client.ShouldRateLimit(ctx, req)
		c.lat.record(time.Since(t0))
		c.replies++
		switch {
		case err != nil:
			st, _ := status.FromError(err)
			c.errors[protocol.Code(grpcCodeName(st))]++
			if c.firstErr == nil {
				c.firstErr = err
			}
		case resp.OverallCode == rlsv3.RateLimitResponse_OK:
			c.allowed++
		case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
			c.denied++
		default:
			c.errors["OVERALL_"+protocol.Code(resp.OverallCode.String())]++
		}
	}
}

// grpcCodeName is a status's code as the gRPC spec writes it
// (UNAVAILABLE, INVALID_ARGUMENT).
func grpcCodeName(st *status.Status) string {
	name := st.Code().String()
	var b []byte
	for i := 0; i < len(name); i++ {
		ch := name[i]
		if i > 0 && ch >= 'A' && ch <= 'Z' {
			b = append(b, '_')
		}
		if ch >= 'a' && ch <= 'z' {
			ch -= 'a' - 'A'
		}
		b = append(b, ch)
	}
	return string(b)
}
