package luascript

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
)

// scripts are every script the package runs; a new one is added here. A
// Loader puts them into Redis before the calls need them (and again, once,
// when a node answers NOSCRIPT); Load exists so that readiness can prove,
// before traffic arrives, that Redis accepts them (scripting enabled, no
// ACL refusing EVAL, not out of memory).
var scripts = []*script{
	fixedWindowTake, fixedWindowPeek,
	tokenBucketTake, tokenBucketPeek,
	concurrencyTake, concurrencyPeek, concurrencyRelease,
	slidingWindowTake, slidingWindowPeek,
	calendarTake, calendarPeek,
	fixedWindowSettle, slidingWindowSettle, calendarSettle, tokenBucketSettle,
	takeChecks, giveBack,
}

// sources are the scripts' texts, prelude included, as Redis holds them,
// and the batch scripts' (batch.go), which compose the others.
var sources = func() []string {
	srcs := make([]string, len(scripts), len(scripts)+len(batches))
	for i, s := range scripts {
		srcs[i] = s.src
	}
	for _, b := range batches {
		srcs = append(srcs, b.src)
	}
	return srcs
}()

// Load runs SCRIPT LOAD for every script on every node the client knows
// (one for a single Redis, each node of a cluster), one round trip per
// node and the nodes at once, and checks that Redis names each script by
// the SHA1 the calls will use. A Redis that refuses a script (an ACL
// without SCRIPT LOAD, scripting disabled) fails it. In a cluster, a node
// that cannot be reached is left out: a dead replica serves no decision,
// and the slots of a dead master answer UNAVAILABLE whatever readiness
// says, while the other slots keep working.
func Load(ctx context.Context, c rueidis.Client) error {
	nodes := c.Nodes()
	errs := make(chan error, len(nodes))
	for addr, node := range nodes {
		go func() { errs <- loadOn(ctx, addr, node) }()
	}
	var first error
	reached := 0
	for range nodes {
		err := <-errs
		if err == nil {
			reached++
			continue
		}
		if _, reply := rueidis.IsRedisErr(errors.Unwrap(err)); !reply && len(nodes) > 1 && ctx.Err() == nil {
			continue // unreachable cluster node
		}
		if first == nil {
			first = err
		}
	}
	if first == nil && reached == 0 {
		first = errors.New("script load: no redis node answered")
	}
	return first
}

// loadOn loads every script on one node in one round trip.
func loadOn(ctx context.Context, addr string, node rueidis.Client) error {
	cmds := make(rueidis.Commands, len(sources))
	for i, src := range sources {
		cmds[i] = node.B().ScriptLoad().Script(src).Build()
	}
	for i, res := range node.DoMulti(ctx, cmds...) {
		src := sources[i]
		sha, err := res.ToString()
		if re, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(src, "#!") && strings.HasPrefix(re.Error(), "Error compiling script") {
			// A store that does not parse a shebang's flags (the embedded
			// one) runs the script without them, as readOnlyScript does.
			src = withoutFlags(src)
			sha, err = node.Do(ctx, node.B().ScriptLoad().Script(src).Build()).ToString()
		}
		if err != nil {
			return fmt.Errorf("script load on %s: %w", addr, err)
		}
		sum := sha1.Sum([]byte(src))
		if want := hex.EncodeToString(sum[:]); sha != want {
			return fmt.Errorf("script load on %s: redis named the script %s, want %s", addr, sha, want)
		}
	}
	return nil
}

// Sources returns the text of every script, prelude included, for tests
// and tools that check what Redis holds.
func Sources() []string { return append([]string(nil), sources...) }
