package luascript_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
)

func sha(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// allLoaded reports whether srv holds every script.
func allLoaded(t *testing.T, c rueidis.Client) bool {
	t.Helper()
	var shas []string
	for _, src := range luascript.Sources() {
		shas = append(shas, sha(src))
	}
	v, err := c.Do(t.Context(), c.B().ScriptExists().Sha1(shas...).Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range v {
		if x != 1 {
			return false
		}
	}
	return true
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// After SCRIPT FLUSH, calls through a Loader's client that find their
// script missing have it loaded once, however many of them find it
// missing at once, and are sent again as EVALSHA: no call carries the
// script's text (no EVAL), and every call runs.
func TestLoaderLoadsAMissingScriptOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	l := luascript.NewLoader(luascript.LoaderOptions{})
	t.Cleanup(l.Close)
	lc := l.Client(c, nil)
	srcs := luascript.Sources()
	// The batch script (the last) and another, called alone and in a
	// DoMulti: with no arguments, each runs and refuses them.
	batch, other := sha(srcs[len(srcs)-1]), sha(srcs[0])
	if err := c.Do(t.Context(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	srv.ResetStats(t)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 50 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res := lc.DoMulti(ctx, lc.B().Evalsha().Sha1(batch).Numkeys(1).Key("k").Build(),
				lc.B().Evalsha().Sha1(other).Numkeys(1).Key("k").Build())
			res = append(res, lc.Do(ctx, lc.B().Evalsha().Sha1(other).Numkeys(1).Key("k").Build()))
			for _, r := range res {
				if re, ok := rueidis.IsRedisErr(r.Error()); r.Error() != nil && (!ok || re.IsNoScript()) {
					errs <- r.Error()
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a call did not run: %v", err)
	}
	if n := srv.CommandCalls(t, "script|load"); n != 2 {
		t.Fatalf("%d SCRIPT LOADs for 2 missing scripts, want one each", n)
	}
	if n := srv.CommandCalls(t, "eval"); n != 0 {
		t.Fatalf("%d calls sent the script's text (EVAL), want none", n)
	}
}

// Connected loads every script a node lacks: all of them the first time,
// and afterwards only those SCRIPT EXISTS says are missing.
func TestLoaderConnectedLoadsWhatANodeLacks(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	reports := make(chan luascript.LoadReport, 16)
	l := luascript.NewLoader(luascript.LoaderOptions{Report: func(r luascript.LoadReport) { reports <- r }})
	t.Cleanup(l.Close)
	var addr string
	var node rueidis.Client
	for a, n := range c.Nodes() {
		addr, node = a, n
	}
	n := len(luascript.Sources())
	if err := c.Do(t.Context(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	l.Connected(addr, node)
	if r := <-reports; r.Err != nil || r.Scripts != n || r.Why != luascript.LoadConnect || r.Addr != addr {
		t.Fatalf("first check: %+v, want %d scripts loaded on %s", r, n, addr)
	}
	if !allLoaded(t, c) {
		t.Fatal("a script is missing after the first check")
	}
	// One script gone: the next check loads that one alone.
	srcs := luascript.Sources()
	if err := c.Do(t.Context(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, src := range srcs[1:] {
		if err := c.Do(t.Context(), c.B().ScriptLoad().Script(src).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	srv.ResetStats(t)
	l.Connected(addr, node)
	if r := <-reports; r.Err != nil || r.Scripts != 1 || r.Bytes != len(srcs[0]) {
		t.Fatalf("second check: %+v, want the one missing script loaded", r)
	}
	if !allLoaded(t, c) {
		t.Fatal("a script is missing after the second check")
	}
	if got := srv.CommandCalls(t, "script|load"); got != 1 {
		t.Fatalf("%d SCRIPT LOADs for one missing script", got)
	}
}

// After SCRIPT FLUSH, a batch of one algorithm's decisions has that
// algorithm's batch script loaded, and no other script: what crosses the
// link is a fraction of every script's text.
func TestLoaderLoadsOnlyTheBatchScriptABatchNeeds(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	reports := make(chan luascript.LoadReport, 16)
	l := luascript.NewLoader(luascript.LoaderOptions{Report: func(r luascript.LoadReport) { reports <- r }})
	t.Cleanup(l.Close)
	m := must(t)
	var calls []luascript.Call
	for i := range 3 {
		calls = append(calls, m(luascript.TakeCall(limits.FixedWindow, args("k", 10, 1, "id"+strconv.Itoa(i)))))
	}
	calls = append(calls, m(luascript.PeekCall(limits.FixedWindow, luascript.Args{Key: "k", Limit: 10, WindowMS: minute})))
	if err := c.Do(t.Context(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	srv.ResetStats(t)
	res := luascript.ExecBatch(t.Context(), l.Client(c, nil), calls)
	for i, r := range res[:3] {
		if d, err := luascript.ParseTake(r); err != nil || !d.Allowed || d.Used != int64(i+1) {
			t.Fatalf("take %d: %+v, %v; want allowed, used %d", i, d, err, i+1)
		}
	}
	if d, err := luascript.ParsePeek(res[3]); err != nil || d.Used != 3 {
		t.Fatalf("peek: %+v, %v; want used 3", d, err)
	}
	want := luascript.BatchTexts()["batch_fixed_window.lua"]
	r := <-reports
	if r.Err != nil || r.Why != luascript.LoadNoScript || r.Scripts != 1 || r.Bytes != len(want) {
		t.Fatalf("load after the flush: %+v, want the fixed window's batch script alone (%d bytes)", r, len(want))
	}
	if r.Bytes >= 40_000 {
		t.Errorf("the fixed window's batch script is %d bytes, want under 40,000", r.Bytes)
	}
	if n := srv.CommandCalls(t, "script|load"); n != 1 {
		t.Errorf("%d SCRIPT LOADs, want 1", n)
	}
	if n := srv.CommandCalls(t, "eval"); n != 0 {
		t.Errorf("%d calls sent a script's text (EVAL), want none", n)
	}
	select {
	case r := <-reports:
		t.Errorf("another load: %+v", r)
	default:
	}
}

// After SCRIPT FLUSH, the calls luascript builds itself (a take alone,
// ExecBatch's batch and its group of one), which go unpinned and are built
// again to be sent again, each run exactly once: every take counts once on
// its key, the two scripts they need are loaded once each, and none
// carries a script's text.
func TestLoaderSendsOwnCallsAgainAfterNoScript(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	l := luascript.NewLoader(luascript.LoaderOptions{})
	t.Cleanup(l.Close)
	lc := l.Client(c, nil)
	m := must(t)
	if err := c.Do(t.Context(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	srv.ResetStats(t)
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	for range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := luascript.Take(ctx, lc, limits.FixedWindow, args("alone", 1000, 1, "")); err != nil {
				errs <- err
			}
			batch := []luascript.Call{m(luascript.TakeCall(limits.FixedWindow, args("batch", 1000, 1, ""))),
				m(luascript.TakeCall(limits.FixedWindow, args("batch", 1000, 2, "")))}
			one := []luascript.Call{m(luascript.TakeCall(limits.FixedWindow, args("one", 1000, 1, "")))}
			for _, r := range append(luascript.ExecBatch(ctx, lc, batch), luascript.ExecBatch(ctx, lc, one)...) {
				if _, err := luascript.ParseTake(r); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a call failed: %v", err)
	}
	for key, want := range map[string]int64{"alone": n, "batch": 3 * n, "one": n} {
		r, err := luascript.Peek(t.Context(), c, limits.FixedWindow, luascript.Args{Key: key, Limit: 1000, WindowMS: minute})
		if err != nil || r.Used != want {
			t.Errorf("%s: used %d (%v), want %d: each take once", key, r.Used, err, want)
		}
	}
	if n := srv.CommandCalls(t, "script|load"); n != 2 {
		t.Errorf("%d SCRIPT LOADs for the take's script and its batch script, want one each", n)
	}
	if n := srv.CommandCalls(t, "eval"); n != 0 {
		t.Errorf("%d calls sent a script's text (EVAL), want none", n)
	}
}
