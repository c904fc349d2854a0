package rls_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"quotad/rls"
)

func TestHealth(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	h := healthpb.NewHealthClient(e.conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("Check(%q): %v", service, err)
		}
		return r.GetStatus()
	}
	for _, s := range []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName} {
		if got := check(s); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q) = %v, want SERVING", s, got)
		}
	}
	e.srv.Serving(false)
	if got := check(""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("after Serving(false): %v, want NOT_SERVING", got)
	}
}

func TestReflection(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	stream, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("services %v lack %s", names, want)
		}
	}
}

// Shutdown answers the calls in flight, refuses new ones, and health
// checks say NOT_SERVING.
func TestGracefulStop(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	start, answered := make(chan struct{}), make(chan struct{})
	var once sync.Once
	for g := range 8 {
		wg.Go(func() {
			<-start
			for i := range 50 {
				resp, err := e.callErr(request("edge", []string{"path", "/login"}, []string{"user", string(rune('a' + (g+i)%20))}))
				switch {
				case err == nil && len(resp.GetStatuses()) == 2:
					once.Do(func() { close(answered) })
				case status.Code(err) == codes.Unavailable:
					// Refused once the server stopped taking calls.
				default:
					errs <- errors.Join(err, errors.New(resp.String()))
				}
			}
		})
	}
	close(start)
	select { // calls are flowing: the shutdown meets some in flight
	case <-answered:
	case <-time.After(waitTimeout):
		t.Fatal("no call was answered")
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a call around the shutdown: %v", err)
	}
	if _, err := e.callErr(request("edge", []string{"user", "z"})); status.Code(err) != codes.Unavailable {
		t.Errorf("a call after Shutdown: %v, want UNAVAILABLE", err)
	}
}

// Listen makes the TCP listener of --rls-addr beside the socket; the
// service answers on both.
func TestListenTCP(t *testing.T) {
	e := setup(t, edge, apiPolicy)
	ls, err := rls.Listen(rls.Options{Addr: "127.0.0.1:0"}, nil)
	if err != nil || len(ls) != 1 {
		t.Fatalf("Listen: %v, %v", ls, err)
	}
	e.srv.Serve(ls[0])
	conn, err := grpc.NewClient(ls[0].Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(t.Context(), request("edge", []string{"user", "tcp"}))
	if err != nil || resp.GetOverallCode() != ok {
		t.Fatalf("over TCP: %v, %v", resp, err)
	}
	if _, err := rls.Listen(rls.Options{Addr: "256.0.0.1:1"}, nil); err == nil || !strings.Contains(err.Error(), "--rls-addr") {
		t.Errorf("a bad address: %v, want an error naming --rls-addr", err)
	}
}
