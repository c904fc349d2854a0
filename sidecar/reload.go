package sidecar

import (
	"bytes"
	"context"
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
	Server   *Server
	Logger   *zap.Logger

	trigger chan struct{}
	last    []byte // contents of the last file loaded, to notice changes
	lastErr string // the last read error logged, so a missing file logs once
}

// NewReloader returns a reloader for path, whose config the server already
// uses. Changes are measured against the contents that config was parsed
// from, so an edit made in between is not missed.
func NewReloader(path string, interval time.Duration, srv *Server, log *zap.Logger) *Reloader {
	return &Reloader{Path: path, Interval: interval, Server: srv, Logger: log.Named("config"),
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
			r.Server.countReload(err)
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
		r.Server.countReload(err)
		return
	}
	r.Server.SetConfig(cfg)
	r.Server.countReload(nil)
	r.Logger.Info("config reloaded", zap.String(keyConfig, r.Path), zap.Strings(keyPolicies, cfg.Names()))
	warnNoPolicies(r.Logger, r.Path, cfg)
}
