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

// Reasons a sidecar is not ready (/readyz, ping's "ready").
var (
	errDraining   = errors.New("draining: the sidecar is shutting down")
	errNotServing = errors.New("not serving its socket yet")
	errNoConfig   = errors.New("no policies loaded")
)

// Reasons Redis is not healthy (/redisz). None of them makes the sidecar
// unready: it still answers every request, as each policy's on_unavailable
// says, and taking the pod out of its Service would not bring Redis back.
var (
	errRedisDown  = errors.New("redis is not answering")
	errLoadingLua = errors.New("the scripts are being loaded into redis")
)

// readiness serialises the script checks of Redis health checks, so that
// probes that meet cost Redis one check, not one each.
type readiness struct {
	loading  sync.Mutex
	loadedAt atomic.Int64 // UnixNano of the last successful load; 0 for none
}

// ready is nil when the sidecar should get traffic: it serves its socket,
// has its policies and is not draining. Redis's health is not part of it
// (see redisHealth): while Redis is down the sidecar still answers, as the
// policies' on_unavailable says, and every replica leaving its Service at
// once would turn a Redis outage into an outage of the whole workload. It
// is what /readyz and ping's "ready" report.
func (s *Server) ready(context.Context) error {
	if s.shutting.Load() {
		return errDraining
	}
	if s.Config() == nil {
		return errNoConfig
	}
	s.mu.Lock()
	serving := len(s.listeners) > 0
	s.mu.Unlock()
	if !serving {
		return errNotServing
	}
	return nil
}

// redisHealth is nil when Redis answers and holds the decision scripts; it
// checks them (SCRIPT EXISTS) on every check and loads those missing
// (SCRIPT LOAD), so a Redis restarted without them has them back before
// the next take, while a check of a Redis that holds them sends no
// script's text: polling it over a slow link after a flush does not send
// every script again each time. Only one caller checks at a time; one
// that meets a check in progress gets the last check's verdict. The
// embedded store is always healthy.
func (s *Server) redisHealth(ctx context.Context) error {
	if !s.store.Up() {
		s.readiness.loadedAt.Store(0)
		if err := s.store.LastError(); err != nil {
			return fmt.Errorf("%w: %v", errRedisDown, err)
		}
		return errRedisDown
	}
	if !s.readiness.loading.TryLock() {
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
