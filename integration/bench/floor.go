package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"quotad/loadgen"
	"quotad/rls"
)

// The gRPC floor: what grpc-go itself costs per ShouldRateLimit call, with
// the rate limit service's server options, in a process whose handler
// decides nothing (it answers OK to every descriptor, without Redis). Its
// rows run the same load as quotad's RLS rows, so the CPU per call of the
// two differ by what quotad adds to the call: matching descriptors, the
// decision, its metrics.
//
// The bench serves it by running its own binary again with floorArg and
// a socket path (floorMain).
const floorArg = "-serve-grpc-floor"

// floorMain serves the gRPC floor and exits, when the process was started
// to (os.Args is floorArg and a socket path), until SIGTERM. It returns
// at once otherwise. main and TestMain call it first.
func floorMain() {
	if len(os.Args) != 3 || os.Args[1] != floorArg {
		return
	}
	if err := serveFloor(os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "bench: gRPC floor:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveFloor(socket string) error {
	l, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	g := grpc.NewServer(rls.ServerOptions()...)
	rlsv3.RegisterRateLimitServiceServer(g, floorService{})
	go func() {
		<-stop
		g.Stop()
	}()
	return g.Serve(l)
}

// floorService answers every call OK, a status per descriptor.
type floorService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (floorService) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return resp, nil
}

// floorServer is the gRPC floor's process, started the first time.
func (b *bench) floorServer(ctx context.Context) (*sidecar, error) {
	if b.floor != nil {
		return b.floor, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	sc := &sidecar{label: "floor", bin: self, file: "floor", rlsSocket: filepath.Join(b.dir, "floor.sock")}
	sc.log = filepath.Join(b.dir, "floor.log")
	logf, err := os.Create(sc.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	sc.cmd = exec.Command(self, floorArg, sc.rlsSocket)
	sc.cmd.Stdout, sc.cmd.Stderr = logf, logf
	if err := sc.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the gRPC floor: %w", err)
	}
	sc.exited = make(chan struct{})
	go func() { _ = sc.cmd.Wait(); close(sc.exited) }()
	b.floor = sc
	return sc, awaitRLS(ctx, sc, "the gRPC floor")
}

// awaitRLS waits until the rate limit service sc started, named what,
// allows a call, for at most 20 s; its log says why it did not.
func awaitRLS(ctx context.Context, sc *sidecar, what string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := loadgen.RunRLS(ctx, loadgen.RLSConfig{Socket: sc.rlsSocket, Duration: time.Millisecond, Domain: rlsDomain, Keys: rlsKeys, SubjectPrefix: "warm-"})
		if err == nil && res.Allowed > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(sc.log)
			return fmt.Errorf("%s did not answer: %v\n%s", what, err, log)
		}
		select {
		case <-sc.exited:
			log, _ := os.ReadFile(sc.log)
			return fmt.Errorf("%s exited:\n%s", what, log)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
