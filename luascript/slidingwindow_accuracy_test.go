package luascript_test

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"quotad/luascript"
)

const (
	accLimit    = 100
	accWindowMS = 2000
	accOffered  = 3 * accLimit // per window
	accMeasured = 5            // windows
	// accMaxGapUS is the longest pause between two offered takes at Redis
	// for a run to count as a steady rate. During a pause the estimate
	// falls and room builds up, about limit * pause / window, which the
	// takes after it fill at once: a pause of a 25th of the window can cost
	// 4 of the 5% the bound allows. A longer one (a host too busy to send
	// or to serve the takes) is a pause and a burst, not the steady load
	// the claim is about.
	accMaxGapUS = accWindowMS * 1000 / 25
)

// At a steady offered rate of three times the limit, the two-window counter
// admits about limit per window: in every window-long interval slid over
// the accepted takes' instants, at most limit * 1.05, and limit per window
// in total within 5%.
//
// Each take reads Redis's clock just before the take script runs, in the
// same script run, so its instant is the one the script decided at, not
// when the reply arrived. The load starts at an arbitrary instant, so its
// first period takes its whole limit at once: a cold start is a burst, and
// a burst late in a period is the approximation's known worst case
// (docs/algorithms.md), which the figure over the whole run shows. From the first
// period boundary on, the counts are in their steady state; the five
// windows after it are measured. Offered takes are sent on a schedule,
// each on its own goroutine, so a slow reply does not slow the offered
// rate. A run whose takes did not reach Redis at a steady rate is run
// again, up to five times in all.
func TestSlidingWindowAccuracy(t *testing.T) {
	e := setup(t)
	for attempt := 1; ; attempt++ {
		k := luascript.SlidingWindowKey(e.prefix, "acc", strconv.Itoa(attempt))
		accepted, offered, err := accuracyRun(t, e, k)
		if err != nil {
			t.Fatal(err)
		}
		gap := int64(0)
		for i := 1; i < len(offered); i++ {
			gap = max(gap, offered[i]-offered[i-1])
		}
		if gap > accMaxGapUS {
			t.Logf("run %d: a pause of %d µs between offered takes at Redis: not a steady rate", attempt, gap)
			if attempt == 5 {
				t.Fatalf("no steady offered rate in %d runs: the host is too busy for this test", attempt)
			}
			continue
		}
		checkAccuracy(t, accepted)
		return
	}
}

// accuracyRun offers takes on key at accOffered per window for the
// measured windows and the part of one before them, and returns the instants, on Redis's clock in µs and
// in order, of the accepted takes and of all of them.
func accuracyRun(t *testing.T, e *env, key string) (accepted, offered []int64, err error) {
	// The take script as Redis runs it, with Redis's clock read first: the
	// same decision, and the instant it was made at.
	src := "local t = redis.call('TIME')\nlocal function take()\n" + luascript.ScriptText("sliding_window_take.lua") +
		"\nend\nlocal r = take()\nreturn {tonumber(t[1]), tonumber(t[2]), r[1]}\n"
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	e.mustDo("SCRIPT", "LOAD", src)
	argv := []string{strconv.Itoa(accLimit), strconv.Itoa(accWindowMS), "1", "10", "0", ""}

	var (
		mu    sync.Mutex
		fails []error
		wg    sync.WaitGroup
	)
	take := func() {
		defer wg.Done()
		v, err := e.c.Do(t.Context(), e.c.B().Evalsha().Sha1(sha).Numkeys(1).Key(key).Arg(argv...).Build()).AsIntSlice()
		mu.Lock()
		defer mu.Unlock()
		if err != nil || len(v) != 3 {
			fails = append(fails, fmt.Errorf("take: %v %v", v, err))
			return
		}
		at := v[0]*1_000_000 + v[1]
		offered = append(offered, at)
		if v[2] == 1 {
			accepted = append(accepted, at)
		}
	}
	total := (accMeasured+1)*accOffered + accOffered/10
	every := time.Duration(accWindowMS) * time.Millisecond / accOffered
	begin := time.Now()
	for i := range total {
		time.Sleep(time.Until(begin.Add(time.Duration(i) * every)))
		wg.Add(1)
		go take()
	}
	wg.Wait()
	if len(fails) > 0 {
		return nil, nil, fmt.Errorf("%d takes failed, first: %v", len(fails), fails[0])
	}
	if len(accepted) == 0 {
		return nil, nil, fmt.Errorf("nothing accepted")
	}
	slices.Sort(accepted)
	slices.Sort(offered)
	return accepted, offered, nil
}

func checkAccuracy(t *testing.T, accepted []int64) {
	const windowUS = accWindowMS * 1000
	// The measured span: the five windows from the first period boundary
	// after the first acceptance, on Redis's clock.
	from := (accepted[0]/windowUS + 1) * windowUS
	to := from + accMeasured*windowUS
	var in []int64
	for _, at := range accepted {
		if at >= from && at < to {
			in = append(in, at)
		}
	}
	// The most accepted in a window-long interval starting at an accepted
	// instant: any interval holds no more than the one starting at its
	// first take.
	most := func(ts []int64, end int64) int {
		best := 0
		for i, at := range ts {
			j, _ := slices.BinarySearch(ts, min(at+windowUS, end))
			best = max(best, j-i)
		}
		return best
	}
	worstAll, worst := most(accepted, 1<<62), most(in, to)
	perWindow := float64(len(in)) / accMeasured
	if last := accepted[len(accepted)-1]; last < to-windowUS/10 {
		t.Fatalf("the last acceptance, at %d µs, is not near the end of the measured span at %d", last, to)
	}
	t.Logf("offered %d per %d ms window; measured %d windows: %d accepted, %.1f per window, at most %d in a window-long interval (%d over the whole run, cold start included)",
		accOffered, accWindowMS, accMeasured, len(in), perWindow, worst, worstAll)
	if worst > accLimit*105/100 {
		t.Errorf("%d accepted in one window-long interval, above limit * 1.05 = %d", worst, accLimit*105/100)
	}
	if perWindow < accLimit*0.95 || perWindow > accLimit*1.05 {
		t.Errorf("%.1f accepted per window, not within 5%% of the limit %d", perWindow, accLimit)
	}
}
