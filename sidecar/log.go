package sidecar

import (
	"fmt"
	"runtime"
	"strings"

	"quotad/policy"
	"quotad/store"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Log keys. They are a public interface (people grep and jq them);
// docs/operations.md documents each one. Change them only with a note
// there.
const (
	keySocket      = "socket"
	keyStore       = "store"
	keyRedisURL    = "redis_url"
	keyConfig      = "config"
	keyPolicies    = "policies"
	keyKeyPrefix   = "key_prefix"
	keyConns       = "conns"
	keyMaxConns    = "max_conns"
	keyBackoff     = "backoff"
	keyInflight    = "inflight"
	keyProcs       = "procs"
	keyVersion     = "version"
	keyTimeout     = "redis_timeout"
	keyAllowInline = "allow_inline"
	keyReason      = "reason"

	keyHTTPAddr = "http_addr"

	// The decision log's keys are the dispatcher's (dispatch/metrics.go).
)

// NewLogger builds the process logger: level is debug, info, warn or error;
// format is json (for machines) or console (for people at a terminal).
// Timestamps are ISO 8601 under "ts", the message under "msg".
func NewLogger(level, format string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	var cfg zap.Config
	switch format {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
	default:
		return nil, fmt.Errorf("--log-format %q: want json or console", format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig = encoderConfig(format)
	cfg.DisableStacktrace = true
	cfg.Sampling = nil
	l, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return l, nil
}

// encoderConfig is how lines of a format are written. A duration is a
// number of seconds in JSON, for machines (1.5, not "1.5s"), and a Go
// duration string on the console, for people.
func encoderConfig(format string) zapcore.EncoderConfig {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeDuration = zapcore.SecondsDurationEncoder
	if format == "console" {
		ec = zap.NewDevelopmentEncoderConfig()
		ec.EncodeDuration = zapcore.StringDurationEncoder
	}
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.TimeKey = "ts"
	return ec
}

// StartInfo is what the start-up log line reports beyond the server's own
// options.
type StartInfo struct {
	Socket     string
	RedisURL   string // redacted before logging
	ConfigPath string
}

// LogStart writes the start-up line, so an operator sees in one place how
// this sidecar is configured. On the embedded store it goes on with what a
// newcomer running it for the first time needs: that quotas live in this
// process only, and a take to try on the socket.
func (s *Server) LogStart(info StartInfo) {
	s.log.Info("quotad started",
		zap.String(keyVersion, s.opts.Version),
		zap.String(keySocket, info.Socket),
		zap.String(keyStore, s.store.Kind()),
		zap.String(keyRedisURL, store.RedactURL(info.RedisURL)),
		zap.String(keyKeyPrefix, s.opts.KeyPrefix),
		zap.String(keyConfig, info.ConfigPath),
		zap.Strings(keyPolicies, s.Config().Names()),
		zap.Bool(keyAllowInline, s.opts.AllowInline),
		zap.Duration(keyTimeout, s.opts.RedisTimeout),
		zap.Int(keyMaxConns, s.opts.MaxConns),
		zap.Int(keyInflight, s.opts.MaxInflightPerConn),
		zap.Int(keyProcs, runtime.GOMAXPROCS(0)),
	)
	if s.store.Kind() == store.StoreEmbedded {
		s.log.Warn("NO REDIS CONFIGURED: quotas live in an embedded in-memory store inside this process; they are not shared with any other sidecar and are lost on exit. Set QUOTAD_REDIS_URL (--redis-url) for real use.")
		// The command is the message, not a field, so that the console
		// format prints it as it can be pasted.
		s.log.Info("try a take: " + tryTake(info.Socket))
	}
	policy.WarnIfEmpty(s.log, info.ConfigPath, s.Config())
}

// tryTake is a shell command that sends one take to the socket at path, as
// the README's first example does.
func tryTake(path string) string {
	return `echo '{"op":"take","subject":"alice","limit":5,"window_ms":60000}' | nc -N -U ` + shellQuote(path)
}

// shellQuote returns s as one shell word: itself when it holds only
// characters no shell treats specially, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-+:,=@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// logShutdown, logForcedExit, logShutdownTimeout and logStopped report the
// stages of a shutdown (Run).
func (s *Server) logShutdown(reason string) {
	s.log.Info("shutting down", zap.String(keyReason, reason), zap.Int(keyConns, s.Conns()))
}

func (s *Server) logForcedExit(signal string) {
	s.log.Warn("second signal: exiting now", zap.String(keyReason, signal))
}

func (s *Server) logShutdownTimeout(err error) {
	s.log.Warn("shutdown timed out; unfinished requests were answered SHUTTING_DOWN", zap.Error(err))
}

func (s *Server) logStopped() { s.log.Info("quotad stopped") }
