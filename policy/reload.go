package policy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"time"

	"go.uber.org/zap"
)

// Reloader keeps the server's policies in step with the config file. It
// reloads on Trigger (SIGHUP) and when the file's contents change; polling
// the contents, rather than watching inodes, also catches the symlink swap
// that Kubernetes ConfigMap volumes do. A file that fails to load is logged
// and the config in use is kept.
type Reloader struct {
	Path     string
	Interval time.Duration
	Target   Target
	Logger   *zap.Logger

	trigger chan struct{}
	last    []byte // contents of the last file loaded, to notice changes
	lastErr string // the last read error logged, so a missing file logs once
}

// Target is what a Reloader keeps in step with the file: the server whose
// policies it swaps.
type Target interface {
	Config() *Config
	SetConfig(*Config)
	// Reloaded counts a reload's outcome; err is nil when the new config
	// is in use.
	Reloaded(err error)
}

// Log keys of the reloader's lines.
const (
	keyConfig   = "config"
	keyPolicies = "policies"
)

// NewReloader returns a reloader for path, whose config the target already
// uses. Changes are measured against the contents that config was parsed
// from, so an edit made in between is not missed.
func NewReloader(path string, interval time.Duration, srv Target, log *zap.Logger) *Reloader {
	return &Reloader{Path: path, Interval: interval, Target: srv, Logger: log.Named("config"),
		trigger: make(chan struct{}, 1), last: srv.Config().source}
}

// Trigger asks for a reload now (on SIGHUP), even if the file looks unchanged.
func (r *Reloader) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run polls until ctx ends.
func (r *Reloader) Run(ctx context.Context) {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.trigger:
			r.load(true)
		case <-t.C:
			r.load(false)
		}
	}
}

func (r *Reloader) load(forced bool) {
	data, err := os.ReadFile(r.Path)
	if err != nil {
		if forced || err.Error() != r.lastErr {
			r.Logger.Error("config reload failed; keeping the config in use", zap.String(keyConfig, r.Path), zap.Error(err))
			r.Target.Reloaded(err)
		}
		r.lastErr = err.Error()
		return
	}
	r.lastErr = ""
	if !forced && bytes.Equal(data, r.last) {
		return
	}
	r.last = data
	cfg, err := ParseConfig(data)
	if err != nil {
		r.Logger.Error("config reload failed; keeping the config in use", zap.String(keyConfig, r.Path), zap.Error(err))
		r.Target.Reloaded(err)
		return
	}
	r.Target.SetConfig(cfg)
	r.Target.Reloaded(nil)
	r.Logger.Info("config reloaded", zap.String(keyConfig, r.Path), zap.Strings(keyPolicies, cfg.Names()))
	WarnIfEmpty(r.Logger, r.Path, cfg)
}

// ValidateConfigPoll validates how often a Reloader polls the policy file.
func ValidateConfigPoll(d time.Duration) error {
	if d <= 0 {
		return errors.New("--config-poll must be positive")
	}
	return nil
}

// WarnIfEmpty warns, at start and on every reload, of a policy file that
// defines no policy.
func WarnIfEmpty(log *zap.Logger, path string, cfg *Config) {
	if path != "" && len(cfg.Policies) == 0 {
		log.Warn(NoPoliciesWarning, zap.String(keyConfig, path))
	}
}
