package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Signals are the signals Run acts on: SIGTERM and SIGINT drain the server
// (a second one forces it closed), SIGHUP asks for a reload.
var Signals = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}

// NotifySignals relays Signals to the returned channel until stop is
// called. Take them first and release them last: a signal that arrives
// while the process starts then drains it once it serves, instead of
// killing it, and a second signal during the final clean-up still means
// "exit now".
func NotifySignals() (sigs <-chan os.Signal, stop func()) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, Signals...)
	return ch, func() { signal.Stop(ch) }
}

// RunOptions says how Run ends.
type RunOptions struct {
	// Signals are the process's signals (NotifySignals); nil never
	// delivers one.
	Signals <-chan os.Signal
	// ShutdownTimeout is how long in-flight requests may finish once
	// draining starts (Shutdown's deadline).
	ShutdownTimeout time.Duration
	// Reload runs on SIGHUP; nil ignores SIGHUP.
	Reload func()
}

// Run serves l until the server is told to stop, and drains it.
//
// SIGTERM, SIGINT or the end of ctx starts a drain: the server stops
// accepting, readiness turns off and in-flight requests get
// ShutdownTimeout to finish (Shutdown). A second SIGTERM or SIGINT during
// the drain closes the server at once (Close) and Run returns
// ErrForcedExit. SIGHUP calls Reload and changes nothing else. Run returns
// nil once the drain has ended, in time or not, and Serve's error if
// accepting fails. It logs each stage.
func (s *Server) Run(ctx context.Context, l net.Listener, opts RunOptions) error {
	// Serve's context ends only with Run: ending ctx drains, it must not
	// close the server as Serve's context would.
	serveCtx, stopServe := context.WithCancel(context.Background())
	defer stopServe()
	served := make(chan error, 1)
	go func() { served <- s.Serve(serveCtx, l) }()

	drained := make(chan error, 1)
	draining := false
	startDrain := func(why string) {
		draining = true
		s.logShutdown(why)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), opts.ShutdownTimeout)
			defer cancel()
			drained <- s.Shutdown(ctx)
		}()
	}
	sigs, done := opts.Signals, ctx.Done()
	for {
		select {
		case sig := <-sigs:
			switch {
			case sig == syscall.SIGHUP:
				if opts.Reload != nil {
					opts.Reload()
				}
			case draining:
				s.logForcedExit(sig.String())
				s.Close()
				return ErrForcedExit
			default:
				startDrain(sig.String())
			}
		case <-done:
			done = nil
			if !draining {
				startDrain("context cancelled")
			}
		case err := <-served:
			if !errors.Is(err, ErrServerClosed) {
				s.Close()
				return fmt.Errorf("serve: %w", err)
			}
			served = nil
		case err := <-drained:
			if err != nil {
				s.logShutdownTimeout(err)
			}
			s.logStopped()
			return nil
		}
	}
}
