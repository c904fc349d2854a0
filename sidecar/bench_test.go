package sidecar

import (
	"bufio"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"quotad/integration/redistest"
	"quotad/store"
)

// benchServer serves on a real Redis without test logs, which would
// dominate the profile.
func benchServer(b *testing.B, flushDelay ...time.Duration) *testServer {
	b.Helper()
	r := redistest.Start(b)
	var fd time.Duration
	if len(flushDelay) > 0 {
		fd = flushDelay[0]
	}
	st, err := store.OpenStore(store.StoreOptions{RedisURL: r.URL(), Logger: zap.NewNop(), FlushDelay: fd})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	return startServer(b, Options{Store: st, AllowInline: true, Logger: zap.NewNop()})
}

func waitStoreUp(b *testing.B, s *Server) {
	b.Helper()
	waitFor(b, "the store to reach redis", s.store.Up)
}

// BenchmarkSocketPipelined is the whole path through one socket: a client
// writes takes 64 at a time and reads the replies. cpu-ns/op is the CPU of
// the whole test process (sidecar and client) per take.
func BenchmarkSocketPipelined(b *testing.B) {
	for _, fd := range []time.Duration{0, 20 * time.Microsecond, 100 * time.Microsecond} {
		b.Run("flush-delay="+fd.String(), func(b *testing.B) { benchSocket(b, 64, false, fd) })
	}
}

// BenchmarkSocketDeniedLocally is the socket path alone: every take hits
// an exhausted window, so Redis is not involved.
func BenchmarkSocketDeniedLocally(b *testing.B) { benchSocket(b, 64, true, 0) }

// processCPU is the CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchSocket(b *testing.B, depth int, hot bool, flushDelay time.Duration) {
	ts := benchServer(b, flushDelay)
	waitStoreUp(b, ts.Server)
	nc, err := net.Dial("unix", ts.sock)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	lineFor := func(i int) string {
		if hot {
			return `{"op":"take","subject":"hot","limit":1,"window_ms":60000}` + "\n"
		}
		return `{"op":"take","subject":"s` + strconv.Itoa(i%10000) + `","limit":1000000,"window_ms":60000}` + "\n"
	}
	r := bufio.NewReaderSize(nc, 64<<10)
	if hot {
		for i := range 2 {
			if _, err := nc.Write([]byte(lineFor(i))); err != nil {
				b.Fatal(err)
			}
			if _, err := r.ReadSlice('\n'); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	done := make(chan error, 1)
	go func() {
		for range b.N {
			if _, err := r.ReadSlice('\n'); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var buf []byte
	for i := 0; i < b.N; {
		buf = buf[:0]
		for j := 0; j < depth && i < b.N; j++ {
			buf = append(buf, lineFor(i)...)
			i++
		}
		if _, err := nc.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkSocketOneAtATime is 16 clients that each wait for a reply before
// sending the next take.
func BenchmarkSocketOneAtATime(b *testing.B) {
	for _, fd := range []time.Duration{0, 20 * time.Microsecond, 100 * time.Microsecond} {
		b.Run("flush-delay="+fd.String(), func(b *testing.B) { benchOneAtATime(b, fd) })
	}
}

func benchOneAtATime(b *testing.B, flushDelay time.Duration) {
	ts := benchServer(b, flushDelay)
	waitStoreUp(b, ts.Server)
	cpu0 := processCPU(b)
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8) // 16 clients on 2 CPUs
	b.RunParallel(func(pb *testing.PB) {
		nc, err := net.Dial("unix", ts.sock)
		if err != nil {
			b.Error(err)
			return
		}
		defer nc.Close()
		r := bufio.NewReader(nc)
		i := n.Add(1) << 32
		for pb.Next() {
			i++
			line := `{"op":"take","subject":"s` + strconv.FormatInt(i%10000, 10) + `","limit":1000000,"window_ms":60000}` + "\n"
			if _, err := nc.Write([]byte(line)); err != nil {
				b.Error(err)
				return
			}
			if _, err := r.ReadSlice('\n'); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}
