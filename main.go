// Command quotad is a sidecar that gives every process in a pod atomic,
// idempotent quota decisions backed by Redis, over a line-based JSON protocol
// on a Unix socket. This file only wires the command line; the server lives in
// package sidecar, the wire format in package protocol.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"quotad/dispatch"
	"quotad/doctor"
	"quotad/policy"
	"quotad/protocol"
	"quotad/sidecar"
	"quotad/store"
)

// version and commit are stamped at build time with
// -ldflags "-X main.version=... -X main.commit=...". An unstamped commit is
// read from the build's VCS information, when Go recorded it.
var (
	version = "dev"
	commit  = ""
)

// Exit codes. Every error run returns that is not a cli.ExitCoder exits
// exitError.
const (
	exitOK     = 0
	exitError  = 1 // an error reply, a transport failure, a bad flag, a bad policy file
	exitDenied = 2 // a denial, only with --exit-code
	exitDoctor = 3 // doctor found keys without a TTL or of the wrong type
)

func main() {
	err := run(context.Background(), os.Args, os.Stdout, os.Stderr)
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode prints err, when it says anything, and returns the process's exit
// status: the code of a cli.ExitCoder (cli.Exit), else exitError. It is
// cli.HandleExitCoder without the os.Exit, so tests read the code too.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(stderr, "quotad:", msg)
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return exitError
}

// run is the whole command line, callable from tests without a subprocess.
// Cancelling ctx stops a running `serve` as SIGTERM would.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	app := &cli.App{
		Name:      "quotad",
		Usage:     "atomic, idempotent quota decisions from Redis over a Unix socket",
		Version:   versionLine(),
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed once, by exitCode, and the process exits
		// there, not inside the command.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			serveCommand(),
			checkCommand(),
			requestCommand("take", "take quota and print the JSON reply"),
			requestCommand("peek", "show a window's usage without consuming"),
			requestCommand("release", "free a concurrency lease (named by --request-id)"),
			requestCommand("settle", "give the actual cost (--cost) of an accepted take (--request-id); 0 refunds it"),
			pingCommand(),
			doctorCommand(),
			benchCommand(),
			versionCommand(),
		},
	}
	return app.RunContext(ctx, args)
}

func socketFlag() *cli.StringFlag {
	return &cli.StringFlag{Name: "socket", Value: "/run/quotad/quotad.sock", EnvVars: []string{"QUOTAD_SOCKET"}, Usage: "path of the Unix socket"}
}

func configFlag(usage string) *cli.StringFlag {
	return &cli.StringFlag{Name: "config", EnvVars: []string{"QUOTAD_CONFIG"}, Usage: usage}
}

func keyPrefixFlag(usage string) *cli.StringFlag {
	return &cli.StringFlag{Name: "key-prefix", Value: "quotad:", EnvVars: []string{"QUOTAD_KEY_PREFIX"}, Usage: usage}
}

// redisFlags are the flags that reach Redis, shared by serve and doctor;
// storeOptions reads them.
func redisFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "redis-url", EnvVars: []string{"QUOTAD_REDIS_URL"}, Usage: "the Redis to use (serve: empty runs an embedded store local to this process; doctor: required). " + redisURLHelp},
		&cli.StringFlag{Name: "redis-ca-file", EnvVars: []string{"QUOTAD_REDIS_CA_FILE"}, Usage: "PEM file of the CAs that sign Redis's TLS certificate (rediss:// URLs); default: the system's"},
		&cli.StringFlag{Name: "redis-password", EnvVars: []string{"QUOTAD_REDIS_PASSWORD"}, Usage: "Redis password, if not in the URL; set it through the env var or --redis-password-file, as arguments are visible in ps"},
		&cli.StringFlag{Name: "redis-password-file", EnvVars: []string{"QUOTAD_REDIS_PASSWORD_FILE"}, Usage: "file holding the Redis password (read at start; a trailing newline is dropped)"},
	}
}

// storeOptions maps redisFlags, and serve's --redis-timeout and
// --redis-flush-delay where the command has them, to the store's options.
func storeOptions(c *cli.Context) store.StoreOptions {
	return store.StoreOptions{
		RedisURL:     c.String("redis-url"),
		CAFile:       c.String("redis-ca-file"),
		Password:     c.String("redis-password"),
		PasswordFile: c.String("redis-password-file"),
		Timeout:      c.Duration("redis-timeout"),
		FlushDelay:   c.Duration("redis-flush-delay"),
	}
}

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
	return &cli.Command{
		Name:   "serve",
		Usage:  "run the sidecar",
		Flags:  flags,
		Action: serve,
	}
}

// redisURLHelp says how --redis-url selects the topology.
const redisURLHelp = `Standalone: redis://[user:pass@]host:6379[/db] (rediss:// for TLS, unix:///path for a socket). ` +
	`Cluster: any node, more nodes as addr=: redis://host1:6379?addr=host2:6379&addr=host3:6379 (a cluster is detected by itself). ` +
	`Sentinel: the sentinels, and the master's name as master_set=: redis://s1:26379?addr=s2:26379&addr=s3:26379&master_set=mymaster ` +
	`(sentinel_password= if the sentinels need one; the URL's password is the master's).`

func serve(c *cli.Context) error {
	// Signals are taken first and released last, so that a second signal
	// during the final clean-up still means "exit now", not a kill.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
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
	if err := errors.Join(opts.Validate(), storeOpts.Validate(), policy.ValidateConfigPoll(c.Duration("config-poll"))); err != nil {
		return err
	}
	if c.Int("procs") < 0 {
		return errors.New("--procs must be 0 (Go's default) or more")
	}
	if opts.Config, err = policy.LoadConfig(cfgPath); err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	if n := c.Int("procs"); n > 0 && (c.IsSet("procs") || os.Getenv("GOMAXPROCS") == "") {
		runtime.GOMAXPROCS(n)
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
	srv.LogStart(sidecar.StartInfo{Socket: c.String("socket"), RedisURL: storeOpts.RedisURL, ConfigPath: cfgPath})

	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	var reloader *policy.Reloader
	if cfgPath != "" {
		reloader = policy.NewReloader(cfgPath, c.Duration("config-poll"), srv, log)
		go reloader.Run(bg)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(bg, l) }()

	drained := make(chan error, 1)
	draining := false
	startDrain := func(why string) {
		draining = true
		srv.LogShutdown(why)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.Duration("shutdown-timeout"))
			defer cancel()
			drained <- srv.Shutdown(ctx)
		}()
	}
	done := c.Context.Done()
	for {
		select {
		case sig := <-sigs:
			switch {
			case sig == syscall.SIGHUP:
				if reloader != nil {
					reloader.Trigger()
				}
			case draining:
				srv.LogForcedExit(sig.String())
				srv.Close()
				return errors.New("forced exit on second signal")
			default:
				startDrain(sig.String())
			}
		case <-done:
			done = nil
			if !draining {
				startDrain("context cancelled")
			}
		case err := <-served:
			if !errors.Is(err, sidecar.ErrServerClosed) {
				srv.Close()
				return fmt.Errorf("serve: %w", err)
			}
			served = nil
		case err := <-drained:
			if err != nil {
				srv.LogShutdownTimeout(err)
			}
			srv.LogStopped()
			return nil
		}
	}
}

// requestFlags are the addressing flags shared by take, peek, release and
// settle, and each one's own.
// algorithmFlags are the inline limits of the algorithms other than the
// fixed window (whose --limit and --window-ms the commands define).
func algorithmFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "algorithm", Usage: "inline algorithm: fixed_window (default), token_bucket, concurrency, sliding_window (with --limit and --window-ms), calendar (with --limit and --period)"},
		&cli.Int64Flag{Name: "rate", Usage: "inline token bucket: tokens per --period-ms"},
		&cli.Int64Flag{Name: "period-ms", Usage: "inline token bucket: period of --rate in milliseconds"},
		&cli.Int64Flag{Name: "burst", Usage: "inline token bucket: tokens it holds (default --rate)"},
		&cli.Int64Flag{Name: "lease-ms", Usage: "inline concurrency: a lease's life in milliseconds"},
		&cli.StringFlag{Name: "period", Usage: "inline calendar: minute, hour, day, week or month (with --limit)"},
		&cli.StringFlag{Name: "time-zone", Usage: "inline calendar: IANA zone of the periods (default UTC)"},
	}
}

func requestFlags(op string) []cli.Flag {
	flags := []cli.Flag{
		socketFlag(),
		&cli.StringFlag{Name: "subject", Aliases: []string{"s"}, Usage: "who or what is limited (or give it as the first argument)"},
		&cli.StringFlag{Name: "policy", Aliases: []string{"p"}, Usage: "named policy from the sidecar's config"},
		&cli.Int64Flag{Name: "limit", Usage: "inline limit (with --window-ms)"},
		&cli.Int64Flag{Name: "window-ms", Usage: "inline window in milliseconds (with --limit)"},
		&cli.Int64Flag{Name: "timeout-ms", Usage: "shorten the sidecar's Redis deadline for this request"},
		&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "give up waiting for the sidecar after this long"},
	}
	flags = append(flags, algorithmFlags()...)
	flags = append(flags,
		&cli.StringFlag{Name: "week-start", Usage: "inline calendar: first day of a week period (default monday)"},
		&cli.Int64Flag{Name: "jitter-ms", Usage: "inline calendar: move this subject's boundaries by up to this many ms"},
	)
	if op == "release" {
		flags = append(flags, &cli.StringFlag{Name: "request-id", Aliases: []string{"r"}, Usage: "the lease to free"})
	}
	if op == "settle" {
		flags = append(flags,
			&cli.Int64Flag{Name: "cost", Required: true, Usage: "the take's actual cost: lower gives back, higher consumes past the limit, 0 refunds"},
			&cli.StringFlag{Name: "request-id", Aliases: []string{"r"}, Required: true, Usage: "the request id of the accepted take"},
		)
	}
	if op == "take" {
		flags = append(flags,
			&cli.Int64Flag{Name: "cost", Value: 1, Usage: "units to take"},
			&cli.StringFlag{Name: "request-id", Aliases: []string{"r"}, Usage: "idempotency key: a retry with the same id gets the original answer"},
			&cli.BoolFlag{Name: "exit-code", Usage: fmt.Sprintf("exit %d when the take is denied (default: a denial exits 0)", exitDenied)},
			checkFlag(),
		)
	}
	return flags
}

func requestCommand(op, usage string) *cli.Command {
	return &cli.Command{
		Name:      op,
		Usage:     usage,
		ArgsUsage: "[subject]",
		// Otherwise a subject named "help" or "h" would print help and
		// exit 0, which a script reads as "allowed".
		HideHelpCommand: true,
		Flags:           requestFlags(op),
		Action: func(c *cli.Context) error {
			req := map[string]any{"op": op}
			if op == "take" {
				if multi, err := takeChecks(c, req); multi {
					if err != nil {
						return err
					}
					return takeCall(c, req)
				}
			}
			// Flags after the subject are not parsed by urfave/cli: refuse
			// them rather than drop a trailing --exit-code silently.
			subject := c.String("subject")
			switch {
			case subject != "" && c.NArg() > 0, c.NArg() > 1:
				return fmt.Errorf("unexpected arguments %q: give one subject, after all flags", c.Args().Slice())
			case subject == "":
				subject = c.Args().First()
			}
			if subject == "" {
				return errors.New("a subject is required (--subject or first argument)")
			}
			req["subject"] = subject
			if p := c.String("policy"); p != "" {
				req["policy"] = p
			}
			if a := c.String("algorithm"); a != "" {
				req["algorithm"] = a
			}
			for _, f := range []string{"limit", "window-ms", "timeout-ms", "cost", "rate", "period-ms", "burst", "lease-ms"} {
				if c.IsSet(f) {
					req[strings.ReplaceAll(f, "-", "_")] = c.Int64(f)
				}
			}
			for _, f := range []string{"period", "time-zone", "week-start"} {
				if c.IsSet(f) {
					req[strings.ReplaceAll(f, "-", "_")] = c.String(f)
				}
			}
			if c.IsSet("jitter-ms") {
				req["jitter_ms"] = c.Int64("jitter-ms")
			}
			if id := c.String("request-id"); id != "" {
				req["request_id"] = id
			}
			if op == "take" {
				return takeCall(c, req)
			}
			_, err := call(c, req)
			return err
		},
	}
}

// takeCall sends a take, with its cost, request id and deadline, and
// exits exitDenied on a denial when --exit-code asks.
func takeCall(c *cli.Context, req map[string]any) error {
	for _, f := range []string{"timeout-ms", "cost"} {
		if c.IsSet(f) {
			req[strings.ReplaceAll(f, "-", "_")] = c.Int64(f)
		}
	}
	if id := c.String("request-id"); id != "" {
		req["request_id"] = id
	}
	reply, err := call(c, req)
	if err != nil {
		return err
	}
	if c.Bool("exit-code") && !reply.Allowed {
		return cli.Exit("", exitDenied)
	}
	return nil
}

func pingCommand() *cli.Command {
	return &cli.Command{
		Name:  "ping",
		Usage: "check that the sidecar answers; prints the store in use and Redis health",
		Flags: []cli.Flag{
			socketFlag(),
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "give up waiting for the sidecar after this long"},
			&cli.BoolFlag{Name: "ready", Value: true, Usage: "exit 1 unless the sidecar is ready (serving and not draining; Redis's health is not part of it); --ready=false only checks that it answers"},
			&cli.BoolFlag{Name: "redis", Usage: "also exit 1 unless Redis answers (redis_ok)"},
		},
		Action: func(c *cli.Context) error {
			reply, err := call(c, map[string]any{"op": "ping"})
			if err == nil && c.Bool("ready") && !reply.Ready {
				return errors.New("the sidecar answers but is not ready (not serving yet, or draining)")
			}
			if err == nil && c.Bool("redis") && !reply.RedisOK {
				why := reply.RedisError
				if why == "" {
					why = "not reached yet"
				}
				return fmt.Errorf("the sidecar answers but Redis does not: %s", why)
			}
			return err
		},
	}
}

func doctorCommand() *cli.Command {
	flags := append(redisFlags(),
		keyPrefixFlag("the sidecars' --key-prefix"),
		&cli.BoolFlag{Name: "fix", Usage: "give keys without a TTL one: the window's own length, else --default-ttl"},
		&cli.DurationFlag{Name: "default-ttl", Value: doctor.DefaultTTL, Usage: "TTL --fix gives a key that records no window length"},
		&cli.IntFlag{Name: "top", Value: 10, Usage: "how many of the largest request-id sets to list"},
		&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
		&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "give up after this long"},
	)
	return &cli.Command{
		Name:        "doctor",
		Usage:       "scan quotad's keys in Redis: keys without a TTL, of the wrong type, the largest request-id sets, keys per policy",
		Description: fmt.Sprintf("Uses SCAN, never KEYS. Exits %d when it finds a key without a TTL or of the wrong type, even one --fix repaired.", exitDoctor),
		Flags:       flags,
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected arguments %q", c.Args().Slice())
			}
			opts := doctor.Options{
				KeyPrefix: c.String("key-prefix"), Fix: c.Bool("fix"), DefaultTTL: c.Duration("default-ttl"), Top: c.Int("top"),
			}
			storeOpts := storeOptions(c)
			if err := errors.Join(opts.Validate(), storeOpts.Validate()); err != nil {
				return err
			}
			client, err := store.OpenClient(storeOpts)
			if err != nil {
				return err
			}
			defer client.Close()
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			report, err := doctor.Run(ctx, client, opts)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				err = report.WriteJSON(c.App.Writer)
			} else {
				err = report.WriteText(c.App.Writer)
			}
			if err != nil {
				return err
			}
			if report.Problems > 0 {
				return cli.Exit("", exitDoctor)
			}
			return nil
		},
	}
}

// checkCommand validates a policy file as serve loads it, for CI: every
// problem on its own line as file:line: message, then exit 1; or a summary
// line and exit 0. A file without policies is valid (serve starts with it)
// but is reported with a warning, as serve logs one.
func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "validate a policy file as serve would load it; prints every problem and exits 1 if there is one",
		Flags: []cli.Flag{configFlag("policy file (YAML) to check")},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected arguments %q: give the file as --config", c.Args().Slice())
			}
			path := c.String("config")
			if path == "" {
				return errors.New("--config is required: the policy file to check")
			}
			cfg, err := policy.LoadConfig(path)
			var problems policy.ConfigErrors
			if errors.As(err, &problems) {
				for _, p := range problems {
					fmt.Fprintln(c.App.ErrWriter, p)
				}
				return fmt.Errorf("%s: %d %s", path, len(problems), plural(len(problems), "problem", "problems"))
			}
			if err != nil {
				return fmt.Errorf("--config: %w", err)
			}
			if len(cfg.Policies) == 0 {
				fmt.Fprintf(c.App.ErrWriter, "quotad: warning: %s: %s\n", path, policy.NoPoliciesWarning)
			}
			_, err = fmt.Fprintf(c.App.Writer, "%d %s ok\n", len(cfg.Policies), plural(len(cfg.Policies), "policy", "policies"))
			return err
		},
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// buildInfo is what `quotad version` prints.
type buildInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

func currentBuild() buildInfo {
	return buildInfo{Version: version, Commit: buildCommit(), Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
}

// buildCommit is the commit stamped by the Makefile, else the one Go
// recorded from the checkout it built in (with -dirty for uncommitted
// changes), else "unknown".
func buildCommit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return "unknown"
	}
	// As short as the Makefile's `git rev-parse --short`.
	return rev[:min(len(rev), 7)] + dirty
}

// versionLine is the one-line form, also printed by --version.
func versionLine() string {
	b := currentBuild()
	return fmt.Sprintf("%s (commit %s, %s, %s)", b.Version, b.Commit, b.Go, b.Platform)
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version, the commit it was built from and the Go version",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: `print {"version","commit","go","platform"} as JSON`}},
		Action: func(c *cli.Context) error {
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(currentBuild())
			}
			_, err := fmt.Fprintln(c.App.Writer, "quotad", versionLine())
			return err
		},
	}
}

// call sends one request to the sidecar and prints the reply line. An error
// reply or a transport failure is an error (non-zero exit, message on
// stderr); a denial is not.
func call(c *cli.Context, req map[string]any) (protocol.Reply, error) {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	client, err := protocol.Dial(ctx, c.String("socket"))
	if err != nil {
		return protocol.Reply{}, err
	}
	defer client.Close()
	line, err := json.Marshal(req)
	if err != nil {
		return protocol.Reply{}, fmt.Errorf("encode request: %w", err)
	}
	raw, err := client.Do(ctx, line)
	if err != nil {
		return protocol.Reply{}, err
	}
	fmt.Fprintf(c.App.Writer, "%s\n", raw)
	var reply protocol.Reply
	if err := json.Unmarshal(raw, &reply); err != nil {
		return reply, fmt.Errorf("decode reply: %w", err)
	}
	if err := reply.Err(); err != nil {
		return reply, err
	}
	return reply, nil
}
