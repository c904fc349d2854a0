package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"quotad/policy"
	"quotad/rls"
	"quotad/rls/descriptors"
	"quotad/sidecar"
)

// rlsFlags are serve's flags of Envoy's rate limit service (docs/envoy.md).
func rlsFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "rls-socket", EnvVars: []string{"QUOTAD_RLS_SOCKET"}, Usage: "path of a Unix socket serving Envoy's rate limit service (gRPC), with --socket-mode's permissions; empty serves none"},
		&cli.StringFlag{Name: "rls-addr", EnvVars: []string{"QUOTAD_RLS_ADDR"}, Usage: "host:port serving Envoy's rate limit service (gRPC) over TCP; empty serves none"},
		&cli.StringFlag{Name: "rls-config", EnvVars: []string{"QUOTAD_RLS_CONFIG"}, Usage: "envoyproxy/ratelimit descriptors: a YAML file or a directory of them, one domain each; required with --rls-socket or --rls-addr; reloaded as --config is"},
		&cli.BoolFlag{Name: "rls-response-headers", EnvVars: []string{"QUOTAD_RLS_RESPONSE_HEADERS"}, Usage: "add the RateLimit-Policy and RateLimit header fields of each decision to the rate limit service's responses"},
	}
}

// rlsOptions maps rlsFlags to the service's options.
func rlsOptions(c *cli.Context, mode os.FileMode) rls.Options {
	return rls.Options{
		Socket: c.String("rls-socket"), SocketMode: mode, Addr: c.String("rls-addr"),
		Config: c.String("rls-config"), ResponseHeaders: c.Bool("rls-response-headers"),
	}
}

// loadRLSConfig loads the descriptors, whose quotad policies must be in
// the policy file.
func loadRLSConfig(path string, cfg *policy.Config) (*descriptors.Config, error) {
	c, err := descriptors.Load(path)
	if err == nil {
		err = c.MissingPolicies(policyExists(func() *policy.Config { return cfg }))
	}
	if err != nil {
		return nil, fmt.Errorf("--rls-config: %w", err)
	}
	return c, nil
}

func policyExists(cfg func() *policy.Config) func(string) bool {
	return func(name string) bool {
		_, ok := cfg().Policies[name]
		return ok
	}
}

// serveRLS serves Envoy's rate limit service beside srv's socket, through
// srv's dispatcher: it drains and closes with srv, and its descriptors are
// reloaded every poll and on the reload it returns (SIGHUP).
func serveRLS(ctx context.Context, srv *sidecar.Server, opts rls.Options, cfg *descriptors.Config, poll time.Duration, tracer trace.TracerProvider, log *zap.Logger) (reload func(), err error) {
	svc := rls.NewService(rls.ServiceOptions{
		Dispatcher: srv.Dispatcher(), Config: cfg, ResponseHeaders: opts.ResponseHeaders,
		Tracer: tracer, TraceInvalid: srv.TraceContextInvalid, Registry: srv.Registry(), Logger: log,
	})
	ls, err := rls.Listen(opts, func(path string) (net.Listener, error) { return sidecar.Listen(path, opts.SocketMode) })
	if err != nil {
		return nil, err
	}
	rs := rls.NewServer(svc, log)
	for _, l := range ls {
		rs.Serve(l)
	}
	srv.AddFront(rs)
	rs.Serving(true)
	reloader := descriptors.NewReloader(opts.Config, poll, svc, log)
	exists := policyExists(srv.Config)
	reloader.Check = func(c *descriptors.Config) error { return c.MissingPolicies(exists) }
	go reloader.Run(ctx)
	log.Info("serving envoy's rate limit service", zap.String("socket", opts.Socket), zap.String("addr", opts.Addr),
		zap.String("config", opts.Config), zap.Strings("domains", cfg.Domains()))
	return reloader.Trigger, nil
}
