// Command redistopo starts a Redis Cluster or a Sentinel setup from
// redis-server on free ports, for a person to try quotad against, prints the
// URL to give it, and stops every process it started on Ctrl-C.
//
//	go run ./integration/redistest/cmd/redistopo cluster|sentinel
package main

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"

	"quotad/integration/redistest"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] != "cluster" && os.Args[1] != "sentinel" {
		fmt.Fprintln(os.Stderr, "usage: redistopo cluster|sentinel")
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	t := &session{}
	defer t.cleanup()
	var url, what string
	switch os.Args[1] {
	case "cluster":
		c := redistest.StartCluster(t, 3)
		url, what = c.URL(), "Redis Cluster: 3 masters, 1 replica each"
		for i, m := range c.Masters {
			fmt.Printf("master %d: %s   replica: %s\n", i, m.Addr(), c.Replicas[i].Addr())
		}
	case "sentinel":
		s := redistest.StartSentinel(t)
		url, what = s.URL(), "Sentinel: master "+s.Master.Addr()+", replica "+s.Replica.Addr()+", master set "+redistest.SentinelMasterName
		for _, sn := range s.Sentinels {
			fmt.Printf("sentinel: %s\n", sn.Addr())
		}
	}
	fmt.Printf("%s is up. In another terminal:\n\n  QUOTAD_REDIS_URL='%s' make run\n\nCtrl-C stops it and removes its files.\n", what, url)
	<-sigs
	fmt.Println("stopping")
}

// session is the testing.TB the harness needs, for a command: failures
// print and exit, clean-ups run at exit, even after a panic.
type session struct {
	testing.TB // only the methods below are called
	mu         sync.Mutex
	cleanups   []func()
}

func (s *session) Helper()      {}
func (s *session) Name() string { return "redistopo" }
func (s *session) Failed() bool { return false }
func (s *session) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *session) TempDir() string {
	dir, err := os.MkdirTemp("", "redistopo")
	if err != nil {
		s.Fatalf("make a temporary directory: %v", err)
	}
	s.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (s *session) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func (s *session) Errorf(format string, args ...any) { s.Logf(format, args...) }

func (s *session) Fatalf(format string, args ...any) {
	s.Logf(format, args...)
	s.cleanup()
	os.Exit(1)
}

func (s *session) Fatal(args ...any) { s.Fatalf("%s", fmt.Sprint(args...)) }

// cleanup runs the clean-ups last first, as testing does, once.
func (s *session) cleanup() {
	if r := recover(); r != nil {
		defer panic(r)
	}
	s.mu.Lock()
	fs := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
