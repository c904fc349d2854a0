package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/protocol"
)

// keyPrefix is the sidecar's key prefix, so every key it wrote can be found.
const keyPrefix = "fb:"

// env is one run's world: a private redis-server, the fault proxy in front
// of it, a quotad sidecar that reaches Redis only through the proxy, and a
// direct client of Redis for the faults that are Redis commands and for the
// checks.
type env struct {
	o      *options
	dir    string
	redis  *redistest.Server
	proxy  *redistest.FaultProxy
	rc     rueidis.Client
	cmd    *exec.Cmd
	exited chan struct{}
	socket string
	log    string
}

func newEnv(o *options, dir string) (*env, error) {
	e := &env{o: o, dir: dir, socket: filepath.Join(dir, "quotad.sock"), log: filepath.Join(dir, "quotad.log")}
	var err error
	if e.redis, err = redistest.Launch(dir); err != nil {
		return nil, err
	}
	if e.proxy, err = redistest.NewFaultProxy(e.redis.Addr()); err != nil {
		e.close()
		return nil, err
	}
	e.rc, err = rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{e.redis.Addr()}, DisableCache: true, ForceSingleClient: true,
	})
	if err != nil {
		e.close()
		return nil, fmt.Errorf("connect to redis-server: %w", err)
	}
	return e, nil
}

// startQuotad starts the sidecar on the proxy and waits until it answers a
// ping that says Redis is up.
func (e *env) startQuotad(ctx context.Context) error {
	logf, err := os.Create(e.log)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{
		"serve", "--socket", e.socket, "--redis-url", e.proxy.URL(),
		"--redis-timeout", e.o.timeout.String(), "--key-prefix", keyPrefix, "--log-level", "info",
	}
	e.cmd = exec.Command(e.o.quotad, args...)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	e.cmd.SysProcAttr = procAttr()
	if err := e.cmd.Start(); err != nil {
		return fmt.Errorf("start quotad: %w", err)
	}
	e.exited = make(chan struct{})
	go func() { _ = e.cmd.Wait(); close(e.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := ping(ctx, e.socket)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("quotad did not answer a ping with redis up: %w\n%s", err, e.logText())
		}
		select {
		case <-e.exited:
			return fmt.Errorf("quotad exited:\n%s", e.logText())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func ping(ctx context.Context, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := protocol.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer c.Close()
	r, _, err := c.Call(ctx, map[string]any{"op": "ping"})
	if err != nil {
		return err
	}
	if !r.RedisOK {
		return errors.New("redis not up yet")
	}
	return nil
}

func (e *env) logText() string {
	b, _ := os.ReadFile(e.log)
	return string(b)
}

// breakerEvent is a "redis is down" (open) or "redis is up" (closed) line
// of the sidecar's log.
type breakerEvent struct {
	at   time.Time
	open bool
}

func (e *env) breakerEvents() ([]breakerEvent, error) {
	f, err := os.Open(e.log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []breakerEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			TS  string `json:"ts"`
			Msg string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || (l.Msg != "redis is down" && l.Msg != "redis is up") {
			continue
		}
		at, err := time.Parse("2006-01-02T15:04:05.000Z0700", l.TS)
		if err != nil {
			return nil, fmt.Errorf("log time %q: %w", l.TS, err)
		}
		evs = append(evs, breakerEvent{at: at, open: l.Msg == "redis is down"})
	}
	return evs, sc.Err()
}

// redisDo runs a command on Redis directly, not through the proxy.
func (e *env) redisDo(ctx context.Context, args ...string) rueidis.RedisResult {
	return e.rc.Do(ctx, e.rc.B().Arbitrary(args...).Build())
}

// commandCalls is INFO commandstats' calls of cmd (lowercase), 0 if none.
func (e *env) commandCalls(ctx context.Context, cmd string) (int64, error) {
	info, err := e.redisDo(ctx, "INFO", "commandstats").ToString()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		return strconv.ParseInt(n, 10, 64)
	}
	return 0, nil
}

func (e *env) close() {
	if e.cmd != nil && e.exited != nil {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(15 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.exited
		}
	}
	if e.rc != nil {
		e.rc.Close()
	}
	if e.proxy != nil {
		e.proxy.Close()
	}
	if e.redis != nil {
		_ = e.redis.Close()
	}
}
