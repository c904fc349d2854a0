package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"quotad/dispatch"
	"quotad/policy"
	"quotad/rls/descriptors"
	"quotad/sidecar"
	"quotad/store"
	"quotad/tracing"
)

// traceFlushTimeout bounds the export of the last spans at exit.
const traceFlushTimeout = 3 * time.Second

func serveCommand() *cli.Command {
	flags := []cli.Flag{
		socketFlag(),
		&cli.StringFlag{Name: "socket-mode", Value: "0660", EnvVars: []string{"QUOTAD_SOCKET_MODE"}, Usage: "permissions of the socket file (octal)"},
	}
	flags = append(flags, redisFlags()...)
	flags = append(flags,
		configFlag("policy file (YAML); reloaded on SIGHUP and when it changes"),
		&cli.DurationFlag{Name: "config-poll", Value: 2 * time.Second, EnvVars: []string{"QUOTAD_CONFIG_POLL"}, Usage: "how often the policy file is checked for changes"},
		keyPrefixFlag("prefix of every Redis key quotad writes"),
		&cli.DurationFlag{Name: "redis-timeout", Value: store.DefaultRedisTimeout, EnvVars: []string{"QUOTAD_REDIS_TIMEOUT"}, Usage: "deadline of every Redis call"},
		&cli.IntFlag{Name: "max-line-bytes", Value: sidecar.DefaultMaxLineBytes, EnvVars: []string{"QUOTAD_MAX_LINE_BYTES"}, Usage: "longest request line; longer ones are answered TOO_LARGE"},
		&cli.IntFlag{Name: "max-conns", Value: sidecar.DefaultMaxConns, EnvVars: []string{"QUOTAD_MAX_CONNS"}, Usage: "most client connections at once"},
		&cli.IntFlag{Name: "max-inflight-per-conn", Value: sidecar.DefaultMaxInflightPerConn, EnvVars: []string{"QUOTAD_MAX_INFLIGHT_PER_CONN"}, Usage: "requests of one connection in flight before reading pauses"},
		&cli.DurationFlag{Name: "idle-timeout", Value: sidecar.DefaultIdleTimeout, EnvVars: []string{"QUOTAD_IDLE_TIMEOUT"}, Usage: "close a connection that sent nothing and has no request in flight for this long (0: never)"},
		&cli.IntFlag{Name: "max-conns-per-peer", EnvVars: []string{"QUOTAD_MAX_CONNS_PER_PEER"}, Usage: "most connections of one client process (by SO_PEERCRED pid); 0: half of --max-conns, at least 64 (all of a smaller --max-conns)"},
		&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second, EnvVars: []string{"QUOTAD_SHUTDOWN_TIMEOUT"}, Usage: "how long in-flight requests may finish after SIGTERM"},
		&cli.BoolFlag{Name: "allow-inline", Value: true, EnvVars: []string{"QUOTAD_ALLOW_INLINE"}, Usage: "accept inline limit/window_ms; false allows named policies only"},
		&cli.IntFlag{Name: "procs", Value: sidecar.DefaultProcs, EnvVars: []string{"QUOTAD_PROCS"}, Usage: "threads running quotad's Go code at once (GOMAXPROCS); 0 keeps Go's default (the CPUs, or the container's CPU limit rounded up to at least 2). Without --procs or QUOTAD_PROCS, a GOMAXPROCS variable is obeyed"},
		&cli.DurationFlag{Name: "redis-flush-delay", Value: sidecar.DefaultFlushDelay, EnvVars: []string{"QUOTAD_REDIS_FLUSH_DELAY"}, Usage: "how long a Redis connection waits after a write to gather the next batch of commands (0: write at once; at most 1ms)"},
		&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"QUOTAD_LOG_LEVEL"}, Usage: "debug, info, warn or error"},
		&cli.StringFlag{Name: "log-format", Value: "json", EnvVars: []string{"QUOTAD_LOG_FORMAT"}, Usage: "json or console"},
		&cli.StringFlag{Name: "http-addr", EnvVars: []string{"QUOTAD_HTTP_ADDR"}, Usage: "host:port serving /metrics, /healthz, /readyz and /redisz; empty serves no HTTP"},
		&cli.StringFlag{Name: "log-decisions", Value: dispatch.LogDecisionsNone, EnvVars: []string{"QUOTAD_LOG_DECISIONS"}, Usage: "none, denied or all: takes that get a (sampled) decision log line"},
	)
	flags = append(flags, rlsFlags()...)
	return &cli.Command{
		Name:   "serve",
		Usage:  "run the sidecar",
		Flags:  flags,
		Action: serve,
	}
}

func serve(c *cli.Context) error {
	// Signals are taken first and released last, so that a second signal
	// during the final clean-up still means "exit now", not a kill.
	sigs, stopSignals := sidecar.NotifySignals()
	defer stopSignals()
	if c.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", c.Args().Slice())
	}
	log, err := sidecar.NewLogger(c.String("log-level"), c.String("log-format"))
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	mode, err := sidecar.ParseSocketMode(c.String("socket-mode"))
	if err != nil {
		return err
	}
	opts := sidecar.Options{
		KeyPrefix:          c.String("key-prefix"),
		RedisTimeout:       c.Duration("redis-timeout"),
		MaxLineBytes:       c.Int("max-line-bytes"),
		MaxConns:           c.Int("max-conns"),
		MaxInflightPerConn: c.Int("max-inflight-per-conn"),
		AllowInline:        c.Bool("allow-inline"),
		Version:            version,
		Logger:             log,
		LogDecisions:       c.String("log-decisions"),
		IdleTimeout:        c.Duration("idle-timeout"),
		MaxConnsPerPeer:    c.Int("max-conns-per-peer"),
	}
	storeOpts := storeOptions(c)
	storeOpts.Logger = log
	cfgPath := c.String("config")
	rlsOpts := rlsOptions(c, mode)
	if err := errors.Join(opts.Validate(), storeOpts.Validate(), policy.ValidateConfigPoll(c.Duration("config-poll")), rlsOpts.Validate()); err != nil {
		return err
	}
	if c.Int("procs") < 0 {
		return errors.New("--procs must be 0 (Go's default) or more")
	}
	if opts.Config, err = policy.LoadConfig(cfgPath); err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var rlsConfig *descriptors.Config
	if rlsOpts.Enabled() {
		if rlsConfig, err = loadRLSConfig(rlsOpts.Config, opts.Config); err != nil {
			return err
		}
	}
	if n := c.Int("procs"); n > 0 && (c.IsSet("procs") || os.Getenv("GOMAXPROCS") == "") {
		runtime.GOMAXPROCS(n)
	}
	tp, err := tracing.Start(c.Context, tracing.Options{Version: version, Logger: log})
	if err != nil {
		return err
	}
	if tp != nil {
		opts.Tracer = tp
		log.Info("exporting traces", zap.String("endpoint", tp.Endpoint), zap.String("protocol", tp.Protocol))
		defer func() {
			// The spans of the last decisions, sent while the pod stops;
			// a collector that does not take them does not hold it up.
			ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
			defer cancel()
			_ = tp.Shutdown(ctx)
		}()
	}
	if opts.Store, err = store.OpenStore(storeOpts); err != nil {
		return err
	}
	defer opts.Store.Close()
	// Listen once the first connection attempt has an outcome, so that the
	// first requests (clients reconnecting after a restart) are not
	// answered "not connected" while the first dial is under way. A Redis
	// that does not answer holds the socket back by --redis-timeout at most.
	select {
	case <-opts.Store.Started():
	case <-time.After(cmp.Or(c.Duration("redis-timeout"), store.DefaultRedisTimeout)):
	}
	l, err := sidecar.Listen(c.String("socket"), mode)
	if err != nil {
		return err
	}
	srv := sidecar.NewServer(opts)
	defer srv.Close() // ends the dispatcher's runners on every way out
	if addr := c.String("http-addr"); addr != "" {
		hs, err := sidecar.ListenHTTP(addr, srv)
		if err != nil {
			l.Close()
			return err
		}
		defer hs.Close()
	}
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	var reloads []func()
	if rlsOpts.Enabled() {
		svc, err := serveRLS(bg, srv, rlsOpts, rlsConfig, c.Duration("config-poll"), opts.Tracer, log)
		if err != nil {
			l.Close()
			return err
		}
		reloads = append(reloads, svc)
	}
	srv.LogStart(sidecar.StartInfo{Socket: c.String("socket"), RedisURL: storeOpts.RedisURL, ConfigPath: cfgPath})

	runOpts := sidecar.RunOptions{Signals: sigs, ShutdownTimeout: c.Duration("shutdown-timeout")}
	if cfgPath != "" {
		reloader := policy.NewReloader(cfgPath, c.Duration("config-poll"), srv, log)
		go reloader.Run(bg)
		reloads = append(reloads, reloader.Trigger)
	}
	if len(reloads) > 0 {
		runOpts.Reload = func() {
			for _, r := range reloads {
				r()
			}
		}
	}
	return srv.Run(c.Context, l, runOpts)
}
