package luascript

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
)

// sources are every script the package runs. Exec loads a script on its
// first NOSCRIPT by itself; Load exists so that readiness can prove, before
// traffic arrives, that Redis accepts them (scripting enabled, no ACL
// refusing EVAL, not out of memory).
var sources = []string{
	fixedWindowTakeSrc, fixedWindowPeekSrc,
	tokenBucketTakeSrc, tokenBucketPeekSrc,
	concurrencyTakeSrc, concurrencyPeekSrc, concurrencyReleaseSrc,
}

// Load runs SCRIPT LOAD for every script on every node the client knows
// (one for a single Redis, each node of a cluster), and checks that Redis
// names each by the SHA1 the calls will use.
func Load(ctx context.Context, c rueidis.Client) error {
	for addr, node := range c.Nodes() {
		for _, src := range sources {
			sha, err := node.Do(ctx, node.B().ScriptLoad().Script(src).Build()).ToString()
			if re, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(src, "#!") && strings.HasPrefix(re.Error(), "Error compiling script") {
				// A store that does not parse a shebang's flags (the
				// embedded one, Redis 6) runs the script without them, as
				// readOnlyScript does.
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
	}
	return nil
}

// Sources returns the source of every script, for tests and tools that
// check what Redis holds.
func Sources() []string { return append([]string(nil), sources...) }
