package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"quotad/luascript"
)

// Reasons a sidecar is not ready, as /readyz reports them.
var (
	errDraining   = errors.New("draining: the sidecar is shutting down")
	errRedisDown  = errors.New("redis is not answering")
	errLoadingLua = errors.New("the scripts are being loaded into redis")
)

// scriptCheckInterval is how long a successful script load vouches for
// Redis holding the scripts when ping asks. Redis may have restarted
// without them since; the decision calls load them again by themselves,
// so this only bounds how stale a ping's "ready" may be.
const scriptCheckInterval = 10 * time.Second

// readiness remembers when the scripts were last loaded, so that a ping
// costs a Redis round trip at most once per scriptCheckInterval.
type readiness struct {
	loading  sync.Mutex
	loadedAt atomic.Int64 // UnixNano of the last successful load; 0 for none
}

// ready is nil when the sidecar should get traffic: it is not draining,
// Redis answers, and Redis accepted the scripts within the last
// scriptCheckInterval. It is what ping's "ready" reports.
func (s *Server) ready(ctx context.Context) error { return s.checkReady(ctx, false) }

// checkReady is ready; fresh loads the scripts whatever a recent check
// found (for /readyz, which runs on its own goroutine, not a connection's
// reader). Only one caller loads at a time; the others get the last load's
// verdict.
func (s *Server) checkReady(ctx context.Context, fresh bool) error {
	if s.shutting.Load() {
		return errDraining
	}
	if !s.store.Up() {
		s.readiness.loadedAt.Store(0)
		return errRedisDown
	}
	recent := func() bool {
		at := s.readiness.loadedAt.Load()
		return at != 0 && time.Since(time.Unix(0, at)) < scriptCheckInterval
	}
	if !fresh && recent() {
		return nil
	}
	if !s.readiness.loading.TryLock() {
		// Another check is loading right now: a load that succeeded before
		// it still vouches, so two probes that meet do not read "not ready".
		if s.readiness.loadedAt.Load() != 0 {
			return nil
		}
		return errLoadingLua
	}
	defer s.readiness.loading.Unlock()
	client, err := s.store.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	defer cancel()
	if err := luascript.Load(ctx, client); err != nil {
		s.readiness.loadedAt.Store(0)
		return fmt.Errorf("load the scripts into redis: %w", err)
	}
	s.readiness.loadedAt.Store(time.Now().UnixNano())
	return nil
}
