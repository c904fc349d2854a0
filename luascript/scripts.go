package luascript

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"quotad/limits"
)

// preludeSrc holds the helpers every script uses (prelude.lua). prelude
// is what each script's body is joined to: the bounds of quotad/limits as
// Lua constants, then preludeSrc.
var (
	//go:embed prelude.lua
	preludeSrc string
	prelude    = boundsLua() + preludeSrc
)

// boundsLua declares the bounds the scripts check, from quotad/limits, so
// that the scripts and the Go side can never disagree.
func boundsLua() string {
	var b strings.Builder
	b.WriteString("-- Bounds, from quotad/limits.\n")
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"MAX_LIMIT", limits.MaxLimit},
		{"MAX_WINDOW_MS", limits.MaxWindowMS},
		{"MAX_LEASES", limits.MaxLeases},
		{"MAX_REQUEST_ID_BYTES", limits.MaxRequestIDBytes},
		{"MAX_REQUEST_IDS", limits.MaxRequestIDs},
		{"MAX_EXACT", 1<<53 - 1},
		{"MAX_PERIOD_MS", maxPeriodMS},
		{"SHARE_SCALE", limits.ShareScale},
	} {
		b.WriteString("local " + c.name + " = " + strconv.FormatInt(c.v, 10) + "\n")
	}
	b.WriteString("local REQUEST_ID_RULE = " + strconv.Quote(limits.RequestIDRule) + "\n")
	return b.String()
}

//go:embed pieces.lua
var piecesSrc string

// pieces are the pieces of pieces.lua by name.
var pieces = func() map[string]string {
	m := map[string]string{}
	parts := strings.Split(piecesSrc, "\n--#piece ")
	for _, p := range parts[1:] {
		name, text, _ := strings.Cut(p, "\n")
		m[name] = strings.TrimRight(text, "\n") + "\n"
	}
	return m
}()

// assemble makes the body of script name from its file: the line
// "--#args" becomes the checks of its contract c (contract.go), and each
// line "--#include <piece> k=v ..." the piece of pieces.lua, its ${k}
// replaced by v. What it cannot assemble (an unknown piece, a ${k} left)
// is a fault of the package's own files, which every test finds at init.
func assemble(name, body string, c *contract) string {
	var b strings.Builder
	for line := range strings.Lines(body) {
		directive := strings.TrimRight(line, "\n")
		switch {
		case directive == "--#args":
			if c == nil {
				panic("luascript: " + name + " has --#args but no contract")
			}
			b.WriteString(c.checksLua())
		case strings.HasPrefix(directive, "--#include "):
			fields := strings.Fields(strings.TrimPrefix(directive, "--#include "))
			text, ok := pieces[fields[0]]
			if !ok {
				panic("luascript: " + name + " includes no piece " + fields[0])
			}
			for _, kv := range fields[1:] {
				k, v, _ := strings.Cut(kv, "=")
				text = strings.ReplaceAll(text, "${"+k+"}", v)
			}
			if strings.Contains(text, "${") {
				panic("luascript: " + name + " leaves a ${...} of piece " + fields[0])
			}
			// The piece's leading comment is for readers of pieces.lua;
			// the script names it in one line, and is the shorter for it
			// (the embedded store parses a script's text on every call).
			for strings.HasPrefix(text, "--") {
				_, text, _ = strings.Cut(text, "\n")
			}
			b.WriteString("-- " + fields[0] + " (pieces.lua)\n" + text)
		default:
			b.WriteString(line)
		}
	}
	return b.String()
}

// join makes a script's text: its body's flags line if it has one (Redis
// reads it only as the first line), the prelude, then the body. The body
// starts with a line naming its file, so a reader of SCRIPT DEBUG or of
// the text Redis holds knows where the prelude ends.
func join(name, body string) string {
	flags := ""
	if strings.HasPrefix(body, "#!") {
		line, rest, _ := strings.Cut(body, "\n")
		flags, body = line+"\n", rest
	}
	return flags + prelude + "\n-- " + name + "\n" + body
}

// script is one of the package's scripts: its text, the SHA1 Redis names
// it by, and how it is sent. Every Call names one.
type script struct {
	name string // its file: "fixed_window_take.lua"
	body string // its file assembled (assemble): src after the prelude
	src  string
	// c is its arguments, nil for a take of several limits; argv are
	// those of ARGV, and fields the fields of Args they are written from.
	c      *contract
	argv   []arg
	fields []field
	sha    string
	// peek: a read-only script, sent with EVALSHA_RO (see readOnlyScript).
	peek bool
	lua  *rueidis.Lua   // a script that writes
	ro   readOnlyScript // a peek
}

// newScript makes the script of file name from its body, joined to the
// prelude. A script that writes is not sent with the retryable variants: a
// take whose reply was lost may have been applied, and only the caller's
// request id makes a second attempt safe. EVALSHA falls back to EVAL on
// NOSCRIPT, which means it did not run.
func newScript(name, file string, c *contract) *script {
	body := assemble(name, file, c)
	src := join(name, body)
	s := &script{name: name, body: body, src: src, c: c, sha: sha1Hex(src), peek: strings.HasPrefix(src, "#!lua flags=no-writes")}
	if c != nil {
		s.argv, s.fields = c.argv(), c.fieldsOf()
	}
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
