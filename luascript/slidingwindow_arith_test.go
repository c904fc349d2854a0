package luascript_test

import (
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"

	"quotad/luascript"
)

// swCase is one instant of the sliding window's arithmetic: a hash holding
// (s, c, p) written under window, read at now, and a take of cost.
type swCase struct {
	limit, window, now, s, c, p, cost int64
}

// swModel is the formula, computed independently and exactly with
// rationals: the estimate at t of a hash (s, c, p), nothing else taken.
func swModel(k swCase, t int64) *big.Rat {
	start := t - t%k.window
	var prev, cur int64
	switch {
	case k.s == start:
		prev, cur = k.p, k.c
	case k.s == start-k.window:
		prev = k.c
	}
	elapsed := t - start
	est := big.NewRat(prev*(k.window-elapsed), k.window)
	return est.Add(est, big.NewRat(cur, 1))
}

func swFits(k swCase, t int64) bool {
	return swModel(k, t).Cmp(big.NewRat(k.limit-k.cost, 1)) <= 0
}

// swEval runs the prelude's sliding_window on every case in one EVAL and
// returns, per case, the estimate rounded up and retry_after_ms.
func swEval(t *testing.T, e *env, cases []swCase) [][2]int64 {
	t.Helper()
	body := `
local out = {}
for i = 1, #ARGV, 7 do
  local limit, window, now, s, c, p, cost = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
    tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  local sw = sliding_window(window)
  local prev, cur, start, elapsed = sw.state(now, s, c, p, window)
  out[#out + 1] = sw.share(prev, elapsed) + cur
  out[#out + 1] = sw.retry(limit, now, prev, cur, start, elapsed, cost)
end
return out
`
	args := []string{"EVAL", luascript.PreludeText() + body, "0"}
	for _, k := range cases {
		for _, v := range []int64{k.limit, k.window, k.now, k.s, k.c, k.p, k.cost} {
			args = append(args, strconv.FormatInt(v, 10))
		}
	}
	arr, err := e.do(args...).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(arr) != 2*len(cases) {
		t.Fatalf("%d results for %d cases", len(arr), len(cases))
	}
	out := make([][2]int64, len(cases))
	for i := range out {
		out[i] = [2]int64{arr[2*i], arr[2*i+1]}
	}
	return out
}

// ceilRat is r rounded up.
func ceilRat(r *big.Rat) int64 {
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// The estimate and retry_after_ms of the scripts are the formula's, exactly:
// against a brute-force search over every millisecond for small windows,
// and, for limits and windows up to the bounds (where prev * window passes
// 2^53), the answer fits and one ms earlier does not (the estimate only
// falls with time, which the small cases check everywhere).
func TestSlidingWindowArithmetic(t *testing.T) {
	e := setup(t)
	rng := rand.New(rand.NewPCG(15, 2026))

	state := func(k swCase) swCase {
		start := k.now - k.now%k.window
		switch rng.IntN(4) {
		case 0:
			k.s = start
		case 1:
			k.s = start - k.window
		case 2:
			k.s = start - k.window*(2+rng.Int64N(3))
		default:
			k.s = start
			k.p = 0
		}
		return k
	}
	var small []swCase
	for range 4000 {
		limit := 1 + rng.Int64N(40)
		k := swCase{limit: limit, window: 1 + rng.Int64N(200), now: 1_700_000_000_000 + rng.Int64N(1_000_000)}
		k.c, k.p, k.cost = rng.Int64N(limit+1), rng.Int64N(limit+1), 1+rng.Int64N(limit)
		small = append(small, state(k))
	}
	for i, got := range swEval(t, e, small) {
		k := small[i]
		if want := ceilRat(swModel(k, k.now)); got[0] != want {
			t.Fatalf("%+v: estimate %d, want ceil = %d", k, got[0], want)
		}
		var want int64 = -1
		for d := int64(0); d <= 3*k.window; d++ {
			fits := swFits(k, k.now+d)
			if fits && want < 0 {
				want = d
			}
			if want >= 0 && !fits {
				t.Fatalf("%+v: fits after %d ms but not after %d: the estimate rose", k, want, d)
			}
		}
		if got[1] != want {
			t.Fatalf("%+v: retry_after_ms %d, brute force %d", k, got[1], want)
		}
	}

	var large []swCase
	for range 4000 {
		limit := luascript.MaxLimit - rng.Int64N(luascript.MaxLimit/2)
		if rng.IntN(2) == 0 {
			limit = 1 + rng.Int64N(luascript.MaxLimit)
		}
		window := luascript.MaxWindowMS - rng.Int64N(luascript.MaxWindowMS/2)
		if rng.IntN(2) == 0 {
			window = 1 + rng.Int64N(luascript.MaxWindowMS)
		}
		k := swCase{limit: limit, window: window, now: 1_700_000_000_000 + rng.Int64N(luascript.MaxWindowMS*10)}
		k.c, k.p, k.cost = rng.Int64N(limit+1), rng.Int64N(limit+1), 1+rng.Int64N(limit)
		if rng.IntN(3) == 0 {
			k.p = limit - rng.Int64N(3) // the largest products
			k.c = rng.Int64N(3)
			k.cost = 1
		}
		large = append(large, state(k))
	}
	for i, got := range swEval(t, e, large) {
		k := large[i]
		if want := ceilRat(swModel(k, k.now)); got[0] != want {
			t.Fatalf("%+v: estimate %d, want ceil = %d", k, got[0], want)
		}
		d := got[1]
		if !swFits(k, k.now+d) || (d > 0 && swFits(k, k.now+d-1)) {
			t.Fatalf("%+v: retry_after_ms %d is not the first ms the take fits", k, d)
		}
	}
}
