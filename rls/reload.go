package rls

import (
	"context"
	"time"

	"go.uber.org/zap"

	"quotad/rls/descriptors"
)

// Reload loads the descriptors at path and uses them when they load,
// differ from those in use, and name only policies that exist (policies
// reports whether one does). A file that does not load is logged and
// counted, and the descriptors in use stay.
func (s *Service) Reload(path string, exists func(policy string) bool) error {
	c, err := descriptors.Load(path)
	if err == nil {
		err = c.MissingPolicies(exists)
	}
	if err != nil {
		s.m.reloads.WithLabelValues("failed").Inc()
		s.log.Error("could not reload the descriptors; keeping those in use", zap.String("path", path), zap.Error(err))
		return err
	}
	if c.Same(s.Config()) {
		return nil
	}
	s.SetConfig(c)
	s.m.reloads.WithLabelValues("ok").Inc()
	s.log.Info("reloaded the descriptors", zap.String("path", path), zap.Strings("domains", c.Domains()))
	return nil
}

// Watch reloads the descriptors at path every interval and whenever
// trigger delivers (SIGHUP), until ctx ends.
func (s *Service) Watch(ctx context.Context, path string, interval time.Duration, trigger <-chan struct{}, exists func(policy string) bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-trigger:
		case <-t.C:
		}
		_ = s.Reload(path, exists)
	}
}
