package luascript

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/rueidis"
)

// scripts are every script the package runs; a new one is added here. A
// Loader puts them into Redis before the calls need them (and again, once,
// when a node answers NOSCRIPT); Load exists so that readiness can prove,
// before traffic arrives, that Redis holds them or accepts them (scripting
// enabled, no ACL refusing SCRIPT LOAD, not out of memory).
var scripts = []*script{
	fixedWindowTake, fixedWindowPeek,
	tokenBucketTake, tokenBucketPeek,
	concurrencyTake, concurrencyPeek, concurrencyRelease,
	slidingWindowTake, slidingWindowPeek,
	calendarTake, calendarPeek,
	fixedWindowSettle, slidingWindowSettle, calendarSettle, tokenBucketSettle,
	calendarGive,
	takeChecks, giveBack,
	fixedWindowReserve, calendarReserve, windowReturn,
	slidingWindowReserve, slidingWindowReturn, tokenBucketReserve, tokenBucketReturn,
}

// sources are the scripts' texts, prelude included, as Redis holds them,
// and the batch scripts' (batch.go), which compose the others; but for
// lazySources.
var sources = func() []string {
	srcs := make([]string, 0, len(scripts)+len(batches))
	for _, s := range scripts {
		if !slices.Contains(alone, s) {
			srcs = append(srcs, s.src)
		}
	}
	for _, b := range batches {
		srcs = append(srcs, b.src)
	}
	return srcs
}()

// lazySources are the texts of the reservations and returns of
// allotments (alone, batch.go): neither Load nor a Loader's check puts
// them into Redis; a Loader loads one on the NOSCRIPT of its first call on
// a node, as any script a node lost. A sidecar without allotments never
// sends them, and a node that lost its scripts is sent only those in use.
var lazySources = func() []string {
	srcs := make([]string, len(alone))
	for i, s := range alone {
		srcs[i] = s.src
	}
	return srcs
}()

// Load makes sure every node the client knows (one for a single Redis,
// each node of a cluster) holds every script, the nodes at once: one
// SCRIPT EXISTS, then a SCRIPT LOAD of each script the node lacks (of all
// of them when SCRIPT EXISTS is refused), checking that Redis names each
// by the SHA1 the calls will use. So a check of a Redis that holds them
// sends no script's text, and one after a flush only what is missing. A
// Redis that refuses a script (an ACL without SCRIPT LOAD, scripting
// disabled) fails it. In a cluster, a node
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

// loadOn loads the scripts one node lacks, in one round trip after the
// SCRIPT EXISTS that finds them.
func loadOn(ctx context.Context, addr string, node rueidis.Client) error {
	missing, err := lacks(ctx, node)
	if err != nil {
		return fmt.Errorf("script exists on %s: %w", addr, err)
	}
	if len(missing) == 0 {
		return nil
	}
	cmds := make(rueidis.Commands, len(missing))
	for i, src := range missing {
		cmds[i] = node.B().ScriptLoad().Script(src).Build()
	}
	for i, res := range node.DoMulti(ctx, cmds...) {
		src := missing[i]
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

// lacks is the sources node does not hold: a peek counts as held when its
// text without the flags line is (the embedded store's, readOnlyScript).
// Every source when Redis refuses SCRIPT EXISTS (an ACL without it).
func lacks(ctx context.Context, node rueidis.Client) ([]string, error) {
	shas := make([]string, 0, 2*len(sources))
	for _, src := range sources {
		shas = append(shas, sha1Hex(src))
		if strings.HasPrefix(src, "#!") {
			shas = append(shas, sha1Hex(withoutFlags(src)))
		}
	}
	exists, err := node.Do(ctx, node.B().ScriptExists().Sha1(shas...).Build()).AsIntSlice()
	if _, reply := rueidis.IsRedisErr(err); reply {
		return sources, nil
	}
	if err != nil {
		return nil, err
	}
	if len(exists) != len(shas) {
		return nil, fmt.Errorf("%d answers for %d scripts", len(exists), len(shas))
	}
	var missing []string
	x := 0
	for _, src := range sources {
		held := exists[x] == 1
		x++
		if strings.HasPrefix(src, "#!") {
			held = held || exists[x] == 1
			x++
		}
		if !held {
			missing = append(missing, src)
		}
	}
	return missing, nil
}

// Sources returns the text of every script, prelude included, for tests
// and tools that check what Redis holds.
func Sources() []string { return append([]string(nil), sources...) }
