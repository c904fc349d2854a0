package integration_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"quotad/integration/redistest"
)

// load keeps takes flowing through a sidecar while a test changes Redis
// under it, and checks every answer against what a correct quota allows.
//
// Each take carries a fresh request_id. An UNAVAILABLE answer leaves its
// outcome unknown, so the take is retried with the same id until it gets a
// definite answer, as a careful client would. Then, per subject with limit
// L and cost 1: every allowed answer saw a distinct `used` (two allows that
// saw the same count mean a write was lost and quota handed out twice), no
// allow saw more than L, every denial saw exactly L (a denial below the
// limit is a wrong deny), and once the load stops Redis holds exactly as
// many takes as were allowed.
type load struct {
	p        *sidecarProc
	limit    int64
	windowMS int64

	stop chan struct{}
	wg   sync.WaitGroup

	definite    atomic.Int64 // takes answered allowed or denied
	unavailable atomic.Int64 // UNAVAILABLE answers (each retried)

	mu      sync.Mutex
	allowed map[string]map[int64]string // subject -> used -> request_id
	denied  map[string]int
	bad     []string // answers no correct sidecar gives
}

const (
	loadLimit    = 15
	loadWindowMS = 600_000 // outlives any test: no window ends during one
)

func newLoad(p *sidecarProc) *load {
	return &load{
		p: p, limit: loadLimit, windowMS: loadWindowMS, stop: make(chan struct{}),
		allowed: map[string]map[int64]string{}, denied: map[string]int{},
	}
}

// run starts a worker taking on subjects picked at random from subjects.
// Each worker has its own connection.
func (l *load) run(t *testing.T, name string, subjects []string) {
	t.Helper()
	c, err := dialLines(l.p.socket)
	if err != nil {
		t.Fatal(err)
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer c.nc.Close()
		for n := 0; ; n++ {
			select {
			case <-l.stop:
				return
			default:
			}
			subject := subjects[rand.IntN(len(subjects))]
			l.take(c, subject, fmt.Sprintf("%s-%d", name, n))
		}
	}()
}

// take sends one take until it has a definite answer. After stop it still
// finishes the take in flight, giving up only after pollTimeout.
func (l *load) take(c *lineConn, subject, id string) {
	line := fmt.Sprintf(`{"op":"take","subject":%q,"limit":%d,"window_ms":%d,"request_id":%q}`, subject, l.limit, l.windowMS, id)
	deadline := time.Time{}
	for {
		r, err := c.roundTrip(line)
		if err != nil {
			l.fail("take %s on %s: %v", id, subject, err)
			return
		}
		if !r.ok() && r.code() == "UNAVAILABLE" {
			l.unavailable.Add(1)
			select {
			case <-l.stop:
				if deadline.IsZero() {
					deadline = time.Now().Add(pollTimeout)
				} else if time.Now().After(deadline) {
					l.fail("take %s on %s: still UNAVAILABLE %v after the load stopped: %s", id, subject, pollTimeout, r)
					return
				}
			default:
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l.record(subject, id, r)
		return
	}
}

func (l *load) record(subject, id string, r reply) {
	used, _ := r.fields["used"].(json.Number)
	allowed, isBool := r.fields["allowed"].(bool)
	u, err := used.Int64()
	if !r.ok() || err != nil || !isBool {
		l.fail("take %s on %s: %s", id, subject, r)
		return
	}
	l.definite.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !allowed {
		l.denied[subject]++
		if u != l.limit {
			l.bad = append(l.bad, fmt.Sprintf("take %s on %s: denied with used %d below the limit %d: %s", id, subject, u, l.limit, r))
		}
		return
	}
	m := l.allowed[subject]
	if m == nil {
		m = map[int64]string{}
		l.allowed[subject] = m
	}
	if other, dup := m[u]; dup {
		l.bad = append(l.bad, fmt.Sprintf("takes %s and %s on %s were both allowed at used %d: a write was lost", other, id, subject, u))
	}
	if u < 1 || u > l.limit {
		l.bad = append(l.bad, fmt.Sprintf("take %s on %s: allowed with used %d outside 1..%d: %s", id, subject, u, l.limit, r))
	}
	m[u] = id
}

func (l *load) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bad = append(l.bad, fmt.Sprintf(format, args...))
}

// waitDefinite waits until n more takes than now got a definite answer.
func (l *load) waitDefinite(t *testing.T, n int64, what string) {
	t.Helper()
	target := l.definite.Load() + n
	eventually(t, fmt.Sprintf("%d more decisions %s", n, what), func() bool { return l.definite.Load() >= target })
}

// finish stops the workers and checks every answer and Redis's final
// counts, read back through the sidecar with peek.
func (l *load) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.bad {
		t.Error(b)
	}
	c := l.p.dial(t)
	subjects, denied := 0, 0
	for _, n := range l.denied {
		denied += n
	}
	for s := range l.allowed {
		subjects++
		r := c.call(peekReq(s, l.limit, l.windowMS))
		if !r.ok() {
			t.Errorf("peek %s: %s", s, r)
			continue
		}
		if got, want := r.num(t, "used"), int64(len(l.allowed[s])); got != want {
			t.Errorf("subject %s: redis holds %d takes, %d were allowed", s, got, want)
		}
	}
	t.Logf("load: %d decisions (%d denials) on %d subjects, %d UNAVAILABLE answers retried", l.definite.Load(), denied, subjects, l.unavailable.Load())
}

// quotadConns counts the connections of quotad (client name "quotad") on a
// Redis node.
func quotadConns(t *testing.T, n *redistest.Server) int {
	t.Helper()
	list := redisString(t, n, "CLIENT", "LIST")
	conns := strings.Count(list, " name=quotad ")
	t.Logf("%s: %d quotad connections", n.Addr(), conns)
	return conns
}

// inlineKey is the Redis key of an inline-limit window.
func inlineKey(prefix, subject string) string {
	return prefix + "fw:{i:" + subject + "}"
}

// keySlot is the Redis Cluster slot of key (CRC16/XMODEM of its hash tag,
// modulo 16384).
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
