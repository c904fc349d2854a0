package luascript

import (
	"context"
	"strings"

	"github.com/redis/rueidis"
)

// readOnlyScript is a peek script. Its first line, "#!lua flags=no-writes",
// tells Redis 7 the script never writes, so Redis runs it on a replica and
// while it refuses writes (out of memory, read-only). Sent with EVALSHA_RO,
// so a routing client may send it to a replica.
//
// The embedded store's Lua (gopher-lua, via miniredis) cannot compile that
// line. A script that does not compile never ran, so the call is repeated
// with the line left out, by plain EVALSHA (miniredis refuses TIME inside
// EVALSHA_RO): one wasted in-process round trip on the embedded store, none
// on Redis 7. Redis 6, which has neither the flags line nor EVALSHA_RO,
// answers "unknown command" and takes the same path.
type readOnlyScript struct {
	flagged *rueidis.Lua
	plain   *rueidis.Lua
}

func newReadOnlyScript(src string) readOnlyScript {
	return readOnlyScript{
		flagged: rueidis.NewLuaScriptReadOnly(src),
		plain:   rueidis.NewLuaScript(withoutFlags(src)),
	}
}

// withoutFlags blanks a script's shebang line, for stores that cannot
// compile it. The line is kept, empty, so error positions stay the same.
func withoutFlags(src string) string {
	if !strings.HasPrefix(src, "#!") {
		return src
	}
	_, rest, _ := strings.Cut(src, "\n")
	return "\n" + rest
}

func (s readOnlyScript) Exec(ctx context.Context, c rueidis.Client, keys, args []string) rueidis.RedisResult {
	res := s.flagged.Exec(ctx, c, keys, args)
	if re, ok := rueidis.IsRedisErr(res.Error()); ok && (strings.HasPrefix(re.Error(), "Error compiling script") || strings.HasPrefix(re.Error(), "ERR unknown command")) {
		return s.plain.Exec(ctx, c, keys, args)
	}
	return res
}
