package sidecar

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
	"quotad/store"
)

// runServer is a Server under Run, driven by signals the test sends, with
// the server's log lines kept for the test to read.
type runServer struct {
	*testServer
	sigs   chan os.Signal
	logs   *observer.ObservedLogs
	cancel context.CancelFunc
	ran    chan error
}

// startRun runs a server on st with opts, whose Signals are the test's.
func startRun(t *testing.T, st *store.Store, opts RunOptions) *runServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "qd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "q.sock")
	l, err := Listen(sock, 0o600)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	srv := NewServer(Options{Store: st, AllowInline: true, RedisTimeout: time.Hour, KeyPrefix: testPrefix, Logger: zap.New(core)})
	rs := &runServer{
		testServer: &testServer{Server: srv, sock: sock},
		sigs:       make(chan os.Signal, 2),
		logs:       logs,
		ran:        make(chan error, 1),
	}
	opts.Signals = rs.sigs
	ctx, cancel := context.WithCancel(context.Background())
	rs.cancel = cancel
	go func() { rs.ran <- srv.Run(ctx, l, opts) }()
	t.Cleanup(func() {
		srv.Close()
		cancel()
		select {
		case <-rs.ran:
		case <-time.After(waitTimeout):
			t.Errorf("Run did not return within %v of Close", waitTimeout)
		}
		waitFor(t, "every connection to close", func() bool { return srv.Conns() == 0 })
	})
	return rs
}

// wait returns Run's error, failing the test if Run does not return.
func (rs *runServer) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-rs.ran:
		rs.ran <- err // for the cleanup
		return err
	case <-time.After(waitTimeout):
		t.Fatalf("Run did not return within %v", waitTimeout)
		return nil
	}
}

// returned reports whether Run has returned, without waiting.
func (rs *runServer) returned() bool {
	select {
	case err := <-rs.ran:
		rs.ran <- err
		return true
	default:
		return false
	}
}

// logged waits for a line with msg, and with reason when it is not empty.
func (rs *runServer) logged(t *testing.T, level zapcore.Level, msg, reason string) {
	t.Helper()
	waitFor(t, "log line "+msg, func() bool {
		for _, e := range rs.logs.FilterMessage(msg).All() {
			if e.Level == level && (reason == "" || e.ContextMap()[keyReason] == reason) {
				return true
			}
		}
		return false
	})
}

// SIGTERM drains: nothing new is accepted, the take in flight gets its real
// reply, and Run returns nil once it is answered.
func TestRunDrainsOnSIGTERM(t *testing.T) {
	r := redistest.Start(t)
	rs := startRun(t, openStore(t, r.URL()), RunOptions{ShutdownTimeout: time.Hour})
	c := rs.dial(t)
	waitRedisOK(t, c)

	pauseWrites(t, r)
	c.send(inlineTake("t1", "drain", 10, ""), `{"op":"ping","id":"t2"}`)
	waitFor(t, "the take to be in flight", func() bool { return rs.everyQueueHolds(1, 1) })
	rs.sigs <- syscall.SIGTERM
	rs.logged(t, zapcore.InfoLevel, "shutting down", "terminated")
	waitFor(t, "the socket file to be removed", func() bool {
		_, err := os.Lstat(rs.sock)
		return errors.Is(err, os.ErrNotExist)
	})
	if nc, err := net.Dial("unix", rs.sock); err == nil {
		nc.Close()
		t.Fatal("a new connection was accepted while draining")
	}
	if rs.returned() {
		t.Fatal("Run returned while a take was in flight")
	}

	unpause(t, r)
	if got := c.recv(); !got.OK || !got.Allowed || string(got.ID) != `"t1"` {
		t.Fatalf("take in flight across the drain = %+v, want its real reply", got)
	}
	if got := c.recv(); !got.OK || string(got.ID) != `"t2"` {
		t.Fatalf("ping behind the take = %+v", got)
	}
	c.expectEOF()
	if err := rs.wait(t); err != nil {
		t.Fatalf("Run = %v, want nil after a full drain", err)
	}
	rs.logged(t, zapcore.InfoLevel, "quotad stopped", "")
	if n := rs.logs.FilterMessageSnippet("timed out").Len(); n != 0 {
		t.Fatalf("a drain in time logged %d timeouts", n)
	}
}

// A second signal while draining closes the server at once: Run returns
// ErrForcedExit though a take is still in flight and the drain has time left.
func TestRunSecondSignalForcesExit(t *testing.T) {
	r := redistest.Start(t)
	rs := startRun(t, openStore(t, r.URL()), RunOptions{ShutdownTimeout: time.Hour})
	c := rs.dial(t)
	waitRedisOK(t, c)

	pauseWrites(t, r)
	c.send(inlineTake("t1", "force", 10, ""))
	waitFor(t, "the take to be in flight", func() bool { return rs.running() == 1 })
	rs.sigs <- syscall.SIGINT
	rs.logged(t, zapcore.InfoLevel, "shutting down", "interrupt")
	rs.sigs <- syscall.SIGTERM
	if err := rs.wait(t); !errors.Is(err, ErrForcedExit) || err.Error() != "forced exit on second signal" {
		t.Fatalf("Run = %v, want ErrForcedExit", err)
	}
	rs.logged(t, zapcore.WarnLevel, "second signal: exiting now", "terminated")
	if n := rs.logs.FilterMessage("quotad stopped").Len(); n != 0 {
		t.Fatal("a forced exit logged quotad stopped")
	}
	// The take was cut off: the connection ends without a decision.
	_ = c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	for {
		line, err := c.r.ReadString('\n')
		if errors.Is(err, io.EOF) && line == "" {
			break
		}
		if err != nil {
			t.Fatalf("read after the forced exit: %v (partial %q)", err, line)
		}
		checkCode(t, "take cut off by the forced exit", decodeReply(t, line), protocol.CodeShuttingDown)
	}
}

// A drain that runs out of time cuts the take off with SHUTTING_DOWN, says
// so in the log, and still ends Run without an error.
func TestRunShutdownTimeout(t *testing.T) {
	r := redistest.Start(t)
	rs := startRun(t, openStore(t, r.URL()), RunOptions{ShutdownTimeout: 100 * time.Millisecond})
	c := rs.dial(t)
	waitRedisOK(t, c)

	pauseWrites(t, r)
	c.send(inlineTake("t1", "late", 10, ""))
	waitFor(t, "the take to be in flight", func() bool { return rs.running() == 1 })
	rs.sigs <- syscall.SIGTERM
	if err := rs.wait(t); err != nil {
		t.Fatalf("Run = %v, want nil after a drain that timed out", err)
	}
	rs.logged(t, zapcore.WarnLevel, "shutdown timed out; unfinished requests were answered SHUTTING_DOWN", "")
	rs.logged(t, zapcore.InfoLevel, "quotad stopped", "")
	checkCode(t, "take cut off by the drain's deadline", c.recv(), protocol.CodeShuttingDown)
}

// SIGHUP reloads and the server goes on serving; the end of the context
// drains as SIGTERM does.
func TestRunReloadsOnSIGHUPAndDrainsWhenTheContextEnds(t *testing.T) {
	reloads := make(chan struct{}, 1)
	rs := startRun(t, openStore(t, ""), RunOptions{ShutdownTimeout: time.Hour, Reload: func() { reloads <- struct{}{} }})
	c := rs.dial(t)
	rs.sigs <- syscall.SIGHUP
	select {
	case <-reloads:
	case <-time.After(waitTimeout):
		t.Fatal("SIGHUP did not reload")
	}
	if got := c.call(`{"op":"ping"}`); !got.OK || !got.Ready {
		t.Fatalf("ping after SIGHUP = %+v, want ready", got)
	}
	if n := rs.logs.FilterMessage("shutting down").Len(); n != 0 {
		t.Fatal("SIGHUP started a shutdown")
	}

	rs.cancel()
	rs.logged(t, zapcore.InfoLevel, "shutting down", "context cancelled")
	c.expectEOF() // idle, so closed at once
	if err := rs.wait(t); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	rs.logged(t, zapcore.InfoLevel, "quotad stopped", "")
}

// A drain gives back the units of allotments the sidecar still holds:
// once it has stopped, Redis counts exactly the takes it allowed.
func TestShutdownReturnsAllotments(t *testing.T) {
	r := redistest.Start(t)
	cfg, err := policy.ParseConfig([]byte("policies:\n  hot:\n    limit: 1000\n    window: 1m\n    allotment: {max_share: 0.5, idle: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Store: openStore(t, r.URL()), Config: cfg})
	c := ts.dial(t)
	waitRedisOK(t, c)
	key := testPrefix + "fw:{p:hot:s}"
	used := func() int64 {
		n, err := r.Do(t, "HGET", key, "used").AsInt64()
		if err != nil {
			t.Fatalf("HGET %s used: %v", key, err)
		}
		return n
	}
	var allowed int64
	waitFor(t, "a take answered from the allotment", func() bool {
		rep := c.call(`{"op":"take","policy":"hot","subject":"s"}`)
		if !rep.Allowed {
			t.Fatalf("take = %+v", rep)
		}
		allowed++
		return rep.Local && used() > allowed
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ts.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := used(); got != allowed {
		t.Fatalf("redis counts %d after the drain, want the %d allowed", got, allowed)
	}
}
