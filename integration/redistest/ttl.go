package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// globEscaper escapes the characters SCAN MATCH treats as a pattern, so a
// prefix matches only itself.
var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)

// AssertAllKeysHaveTTL reports every key under prefix that has no expiry.
// quotad never writes a key without a TTL; a key without one would hold its
// quota forever.
func AssertAllKeysHaveTTL(t testing.TB, c rueidis.Client, prefix string) {
	t.Helper()
	// Not t.Context(): this is usually called from Cleanup, where it is done.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pattern := globEscaper.Replace(prefix) + "*"
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatalf("scan %q: %v", pattern, err)
		}
		if len(e.Elements) > 0 {
			cmds := make(rueidis.Commands, 0, len(e.Elements))
			for _, k := range e.Elements {
				cmds = append(cmds, c.B().Pttl().Key(k).Build())
			}
			for i, r := range c.DoMulti(ctx, cmds...) {
				pttl, err := r.AsInt64()
				if err != nil {
					t.Fatalf("pttl %q: %v", e.Elements[i], err)
				}
				// -2 means the key expired between SCAN and PTTL: fine.
				if pttl == -1 {
					t.Errorf("key %q has no TTL", e.Elements[i])
				}
			}
		}
		cursor = e.Cursor
		if cursor == 0 {
			return
		}
	}
}
