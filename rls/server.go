package rls

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"quotad/limits"
)

// MaxMessageBytes bounds a request message (grpc.MaxRecvMsgSize): the
// largest request within the bounds of limits (MaxRLSDescriptors of
// MaxRLSEntries entries of the longest key and value), with room for
// the encoding. A larger one is refused by gRPC (RESOURCE_EXHAUSTED)
// before it is decoded.
const MaxMessageBytes = limits.MaxRLSDescriptors*limits.MaxRLSEntries*(limits.MaxRLSKeyBytes+limits.MaxRLSValueBytes+16) + 64<<10

// Window is the HTTP/2 flow control window of each call and of each
// connection. A request is at most MaxMessageBytes, and Envoy sends it
// whole: a static window that large never stalls a call for a window
// update, and it turns off grpc's window estimation, whose pings cost
// every connection frames of their own.
const window = 2 << 20

// streamWorkers serve calls on long-lived goroutines, whose stacks have
// grown already, instead of a new goroutine per call, which grows its
// stack on every call (a tenth of the service's CPU in a profile). A
// call holds its worker while it waits for Redis, so there are as many
// as the calls a few Envoy workers keep in flight; a call beyond them
// gets a goroutine of its own.
const streamWorkers = 64

// serverOptions are the gRPC server's: the codec that reads and writes
// the service's messages without reflection (and every other one as
// grpc does), the request bound, the static window, the stream workers,
// and keepalive pings from the client allowed every 10 seconds even
// without calls, as Envoy's keepalive to a local cluster may send them.
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(codec{}),
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.InitialWindowSize(window),
		grpc.InitialConnWindowSize(window),
		grpc.NumStreamWorkers(streamWorkers),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}

// Server serves the Service over gRPC, with the standard health service
// (grpc.health.v1: SERVING while the sidecar is ready) and reflection, on
// any number of listeners.
type Server struct {
	svc    *Service
	g      *grpc.Server
	health *health.Server
	log    *zap.Logger
	served sync.WaitGroup
}

// NewServer returns a server of svc.
func NewServer(svc *Service, log *zap.Logger) *Server {
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{svc: svc, log: log.Named("rls"), health: health.NewServer()}
	s.g = grpc.NewServer(serverOptions()...)
	rlsv3.RegisterRateLimitServiceServer(s.g, svc)
	healthpb.RegisterHealthServer(s.g, s.health)
	reflection.Register(s.g)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	return s
}

// Serving marks the service SERVING (true) or NOT_SERVING for health
// checks.
func (s *Server) Serving(on bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if on {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
}

// Serve serves l in the background until Shutdown or Stop; a failure of
// its accept loop is logged.
func (s *Server) Serve(l net.Listener) {
	s.served.Add(1)
	go func() {
		defer s.served.Done()
		if err := s.g.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("rls listener failed", zap.String("addr", l.Addr().String()), zap.Error(err))
		}
	}()
}

// Shutdown stops accepting calls and lets those in flight finish until
// ctx ends, then ends them (grpc's GracefulStop, then Stop). Health checks
// answer NOT_SERVING from its start.
func (s *Server) Shutdown(ctx context.Context) error {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.g.GracefulStop()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.g.Stop()
		<-done
		err = fmt.Errorf("rls: calls still in flight at the deadline: %w", ctx.Err())
	}
	s.served.Wait()
	return err
}

// Stop closes the listeners and every call at once.
func (s *Server) Stop() {
	s.health.Shutdown()
	s.g.Stop()
	s.served.Wait()
}

// Listen listens on each address opts names: its Unix socket (with
// listenUnix, the JSON socket's way) and its TCP address.
func Listen(opts Options, listenUnix func(path string) (net.Listener, error)) ([]net.Listener, error) {
	var ls []net.Listener
	if opts.Socket != "" {
		l, err := listenUnix(opts.Socket)
		if err != nil {
			return nil, fmt.Errorf("--rls-socket: %w", err)
		}
		ls = append(ls, l)
	}
	if opts.Addr != "" {
		l, err := net.Listen("tcp", opts.Addr)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, fmt.Errorf("--rls-addr: %w", err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// ServerOptions are the options of the service's gRPC server, for a
// server that measures grpc-go's own cost beside it (make bench's gRPC
// floor).
func ServerOptions() []grpc.ServerOption { return serverOptions() }
