package luascript

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/redis/rueidis"
)

// script is one of the package's scripts: its text, the SHA1 Redis names
// it by, and how it is sent. Every Call names one.
type script struct {
	name string // its file: "fixed_window_take.lua"
	src  string
	sha  string
	// peek: a read-only script, sent with EVALSHA_RO (see readOnlyScript).
	peek bool
	lua  *rueidis.Lua   // a script that writes
	ro   readOnlyScript // a peek
}

// newScript registers a script. A script that writes is not sent with the
// retryable variants: a take whose reply was lost may have been applied,
// and only the caller's request id makes a second attempt safe. EVALSHA
// falls back to EVAL on NOSCRIPT, which means it did not run.
func newScript(name, src string) *script {
	s := &script{name: name, src: src, sha: sha1Hex(src), peek: strings.HasPrefix(src, "#!lua flags=no-writes")}
	if s.peek {
		s.ro = newReadOnlyScript(src)
	} else {
		s.lua = rueidis.NewLuaScript(src)
	}
	return s
}

func (s *script) exec(ctx context.Context, c rueidis.Client, keys, args []string) rueidis.RedisResult {
	if s.peek {
		return s.ro.Exec(ctx, c, keys, args)
	}
	return s.lua.Exec(ctx, c, keys, args)
}

func sha1Hex(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

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
	if flagsRefused(res.Error()) {
		return s.plain.Exec(ctx, c, keys, args)
	}
	return res
}

// flagsRefused reports whether a peek's EVALSHA_RO was refused before it
// ran because the store cannot compile the flags line or knows no
// EVALSHA_RO.
func flagsRefused(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && (strings.HasPrefix(re.Error(), "Error compiling script") || strings.HasPrefix(re.Error(), "ERR unknown command"))
}
