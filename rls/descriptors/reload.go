package descriptors

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// Reloader keeps a service's descriptors in step with the file or
// directory they were loaded from, as policy.Reloader does for the policy
// file: it reloads on Trigger (SIGHUP) and when the files' names or
// contents change. It reads the contents rather than watching inodes, so
// it also catches the symlink swap of a Kubernetes ConfigMap volume. A
// change that fails to load (or that Check refuses) is logged and counted,
// and the config in use is kept.
type Reloader struct {
	Path     string
	Interval time.Duration
	Target   Target
	Logger   *zap.Logger
	// Check, when set, vets a config that loaded before it is used: the
	// service checks there that every quotad_policy exists
	// (Config.MissingPolicies).
	Check func(*Config) error

	trigger chan struct{}
	lastErr string   // the last error logged, so a lasting one logs once
	failed  [32]byte // the digest of the files that last failed to parse
}

// Target is what a Reloader keeps in step with the files: the service
// whose descriptors it swaps.
type Target interface {
	Config() *Config
	SetConfig(*Config)
	// Reloaded counts a reload's outcome; err is nil when the new config
	// is in use.
	Reloaded(err error)
}

// Log keys of the reloader's lines.
const (
	keyConfig  = "rls_config"
	keyDomains = "domains"
)

// NewReloader returns a reloader for path, whose config the target already
// uses; changes are measured against the files that config was built from.
func NewReloader(path string, interval time.Duration, t Target, log *zap.Logger) *Reloader {
	return &Reloader{Path: path, Interval: interval, Target: t, Logger: log.Named("rls_config"),
		trigger: make(chan struct{}, 1)}
}

// Trigger asks for a reload now, even if the files look unchanged.
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
			r.Load(true)
		case <-t.C:
			r.Load(false)
		}
	}
}

// Load reloads the files once: when they changed, or always when forced.
// It reports whether a new config is in use.
func (r *Reloader) Load(forced bool) bool {
	cfg, err := r.read(forced)
	if err != nil {
		if forced || err.Error() != r.lastErr {
			r.Logger.Error("rls config reload failed; keeping the config in use", zap.String(keyConfig, r.Path), zap.Error(err))
			r.Target.Reloaded(err)
		}
		r.lastErr = err.Error()
		return false
	}
	if cfg == nil {
		return false
	}
	r.lastErr = ""
	r.Target.SetConfig(cfg)
	r.Target.Reloaded(nil)
	r.Logger.Info("rls config reloaded", zap.String(keyConfig, r.Path), zap.Strings(keyDomains, cfg.Domains()))
	return true
}

// read loads and vets the files; nil and no error when they are those of
// the config in use, or those that last failed to parse, unless forced.
func (r *Reloader) read(forced bool) (*Config, error) {
	files, err := readFiles(r.Path)
	if err != nil {
		return nil, err
	}
	sum := digest(files)
	cur := r.Target.Config()
	if !forced && (cur != nil && sum == cur.digest || sum == r.failed) {
		return nil, nil
	}
	cfg, err := build(files)
	if err != nil {
		r.failed = sum
		return nil, err
	}
	r.failed = [32]byte{}
	if r.Check != nil {
		// Checked on every poll until it passes: what it checks against
		// (the policy file) may change without these files changing.
		if err := r.Check(cfg); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}
