package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"quotad/loadgen"
)

// The allotment rows: a sidecar answering hot keys from the units it
// reserved in Redis (docs/allotments.md), against the same sidecar taking
// every decision in Redis and against the in-process client on the same
// hot keys; and the 10,000-subject workload, where a sidecar sees too few
// takes of a subject to reserve ahead, with allotments on and off.
//
// The hot-key workload is takes of cost 1 over hotSubjects subjects. The
// quotad rows take named policies with the largest limit, which no row
// reaches; the in-process client's script refuses limits above 10,000,
// so its rows use that limit and move each subject to a fresh key before
// it could be reached: no row is ever denied.
const (
	hotSubjects = 100
	// hotKeyUses is how many decisions a hot subject's key takes, on
	// average, in the in-process rows before the subject moves to a fresh
	// key: half the original script's limit, so that the busiest key of a
	// uniform spread stays far below it.
	hotKeyUses = limit / 2
	// allotmentIdle is the policies' idle: what a sidecar holds goes back
	// this long after its last take.
	allotmentIdle = 250 * time.Millisecond
	// wideRounds is the fewest rounds the 10,000-subject rows are measured
	// in, with and without allotments alternating, whatever -rounds says.
	wideRounds = 5
)

// allotmentPolicies is the policy file of the allotment rows' sidecar:
// each policy with allotments beside the same one without.
var allotmentPolicies = fmt.Sprintf(`policies:
  hot:
    limit: 1000000000
    window: %[1]dms
    allotment: {idle: %[3]dms}
  hot-exact:
    limit: 1000000000
    window: %[1]dms
  wide:
    limit: %[2]d
    window: %[1]dms
    allotment: {idle: %[3]dms}
  wide-exact:
    limit: %[2]d
    window: %[1]dms
`, windowMS, limit, allotmentIdle.Milliseconds())

// The allotment rows' indices in matrix, set as they are added.
var (
	rowHot, rowHotExact, rowInProcHot          int // pipelining, 64 conns x 16
	rowHotOne, rowHotOneExact, rowInProcHotOne int // one at a time, 16 conns x 1
	rowWide, rowWideExact                      int
)

func init() {
	n := len(matrix)
	rowHot, rowHotExact, rowInProcHot = n, n+1, n+2
	rowHotOne, rowHotOneExact, rowInProcHotOne = n+3, n+4, n+5
	rowWide, rowWideExact = n+6, n+7
	matrix = append(matrix,
		row{name: "hot keys, allotments, 64x16", sidecar: true, algorithm: "fixed_window", conns: 64, inflight: 16, inProcess: rowInProcHot, mainOnly: true, policy: "hot", subjects: hotSubjects},
		row{name: "hot keys, no allotments, 64x16", sidecar: true, algorithm: "fixed_window", conns: 64, inflight: 16, inProcess: rowInProcHot, mainOnly: true, policy: "hot-exact", subjects: hotSubjects},
		row{name: "in-process, hot keys, 1024 goroutines", conns: 1024, inflight: 1, inProcess: -1, subjects: hotSubjects},
		row{name: "hot keys, allotments, 16x1", sidecar: true, algorithm: "fixed_window", conns: 16, inflight: 1, inProcess: rowInProcHotOne, mainOnly: true, policy: "hot", subjects: hotSubjects},
		row{name: "hot keys, no allotments, 16x1", sidecar: true, algorithm: "fixed_window", conns: 16, inflight: 1, inProcess: rowInProcHotOne, mainOnly: true, policy: "hot-exact", subjects: hotSubjects},
		row{name: "in-process, hot keys, 16 goroutines", conns: 16, inflight: 1, inProcess: -1, subjects: hotSubjects},
		row{name: "10,000 subjects, allotments, 64x16", sidecar: true, algorithm: "fixed_window", conns: 64, inflight: 16, inProcess: rowInProcPipe, mainOnly: true, policy: "wide", subjects: 10_000, minRounds: wideRounds},
		row{name: "10,000 subjects, no allotments, 64x16", sidecar: true, algorithm: "fixed_window", conns: 64, inflight: 16, inProcess: rowInProcPipe, mainOnly: true, policy: "wide-exact", subjects: 10_000, minRounds: wideRounds},
	)
}

// allotmentSidecar is the sidecar of the allotment rows, of base's build,
// with allotmentPolicies; started the first time.
func (b *bench) allotmentSidecar(ctx context.Context, base *sidecar) (*sidecar, error) {
	if b.allotment != nil {
		return b.allotment, nil
	}
	path := filepath.Join(b.dir, "allotment-policies.yaml")
	if err := os.WriteFile(path, []byte(allotmentPolicies), 0o600); err != nil {
		return nil, err
	}
	sc := &sidecar{label: base.label, bin: base.bin, file: base.label + "-allotment", env: []string{"QUOTAD_CONFIG=" + path}}
	if err := b.startSidecar(ctx, sc); err != nil {
		return nil, err
	}
	b.allotment = sc
	return sc, nil
}

func (b *bench) stopAllotment() {
	if b.allotment != nil {
		b.stopSidecar(b.allotment)
		b.allotment = nil
	}
}

// policyLoad is cfg taking the named policy instead of inline limits.
func policyLoad(cfg loadgen.Config, policy string) loadgen.Config {
	cfg.Policy, cfg.Algorithm, cfg.Period, cfg.TimeZone = policy, "", "", ""
	cfg.Limit, cfg.WindowMS, cfg.Rate, cfg.PeriodMS, cfg.Burst, cfg.LeaseMS = 0, 0, 0, 0, 0, 0
	return cfg
}

// settleAllotments waits, after a policy row's load, until what the
// sidecar holds has gone back to Redis, so that the row's CPU figures
// count the returns of its reservations. The rows without allotments wait
// alike.
func settleAllotments() {
	time.Sleep(allotmentIdle + 250*time.Millisecond)
}

// hotKeys names the in-process client's keys of the hot-key workload.
type hotKeys struct {
	subjects int
	taken    atomic.Int64 // decisions asked for so far, by every goroutine
}

// key is the key of the subject rng picks: every hotKeyUses * subjects
// decisions, every subject moves to a fresh key.
func (h *hotKeys) key(prefix string, rng uint64) string {
	gen := h.taken.Add(1) / int64(h.subjects*hotKeyUses)
	return "bench:" + prefix + "hot" + strconv.FormatInt(gen, 10) + "-{" + strconv.FormatUint(rng%uint64(h.subjects), 10) + "}"
}

var errDenied = errors.New("the original script denied a take of the hot-key workload")

// notDenied reads the original script's reply {allowed, used, replay}.
func notDenied(resp rueidis.RedisResult) error {
	v, err := resp.AsIntSlice()
	if err != nil {
		return err
	}
	if len(v) != 3 || v[0] != 1 {
		return errDenied
	}
	return nil
}

// allotmentHeader describes the allotment rows' workload when any is
// measured.
func (b *bench) allotmentHeader() {
	for _, i := range []int{rowHot, rowHotExact, rowInProcHot, rowHotOne, rowHotOneExact, rowInProcHotOne, rowWide, rowWideExact} {
		if b.measured(i) {
			fmt.Fprintf(b.out, "allotment rows: hot keys are takes of cost 1 over %d subjects, of a named policy of limit 1000000000 per %d ms with and without allotments (idle %v), and the in-process client's of limit %d on keys that move on every %d decisions of a subject; 10,000 subjects: the workload above through a named policy with and without allotments, at least %d rounds\n",
				hotSubjects, windowMS, allotmentIdle, limit, hotKeyUses, wideRounds)
			return
		}
	}
}

// allotmentChecks prints the allotment rows' targets for build k, of the
// rows measured.
func (b *bench) allotmentChecks(samples [][][]sample, k int, label func(string) string) {
	has := func(rows ...int) bool {
		for _, i := range rows {
			if len(of(samples, i, k)) == 0 {
				return false
			}
		}
		return true
	}
	p99 := func(s sample) float64 { return float64(s.p99) }
	if has(rowHot, rowInProcHot) {
		x := ratio(samples, rowHot, k)
		fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 3x    %s\n", label("hot keys, pipelining, allotments vs in-process"), x, verdict(x >= 3))
		c := pairedRatio(of(samples, rowHot, k), samples[rowInProcHot][0], redisCPU)
		fmt.Fprintf(b.out, "%-58s %8.3fx  target <= 0.05x %s (%.2f µs against %.2f µs)\n", label("hot keys, pipelining, Redis CPU per decision vs original"), c, verdict(c <= 0.05),
			medianOf(of(samples, rowHot, k), redisCPU), medianOf(samples[rowInProcHot][0], redisCPU))
	}
	if has(rowHotOne, rowInProcHotOne) {
		x := ratio(samples, rowHotOne, k)
		fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 1.0x  %s\n", label("hot keys, one at a time, allotments vs in-process"), x, verdict(x >= 1))
		p := pairedRatio(of(samples, rowHotOne, k), samples[rowInProcHotOne][0], p99)
		fmt.Fprintf(b.out, "%-58s %8.2fx  target <= 1.0x  %s (%v against %v)\n", label("hot keys, one at a time, p99 allotments vs in-process"), p, verdict(p <= 1),
			dur(of(samples, rowHotOne, k), func(s sample) time.Duration { return s.p99 }),
			dur(samples[rowInProcHotOne][0], func(s sample) time.Duration { return s.p99 }))
	}
	if has(rowWide, rowWideExact) {
		with, without := of(samples, rowWide, k), of(samples, rowWideExact, k)
		x := pairedRatio(with, without, rate)
		lo, hi := pairedRange(with, without, rate)
		fmt.Fprintf(b.out, "%-58s %8.2fx  target >= 0.95x %s (rounds' ratios %.2fx to %.2fx, %d rounds)\n", label("10,000 subjects, allotments vs without"), x, verdict(x >= 0.95),
			lo, hi, min(len(with), len(without)))
	}
}
