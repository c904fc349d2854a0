package luascript

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/redis/rueidis"
)

// Call is one fixed-window take or peek, validated and ready to send; build
// it with TakeCall or PeekCall.
type Call struct {
	rueidis.LuaExec
	peek bool
}

// Exec sends the call alone: EVALSHA, with EVAL on NOSCRIPT.
func (c Call) Exec(ctx context.Context, client rueidis.Client) rueidis.RedisResult {
	if c.peek {
		return fixedWindowPeek.Exec(ctx, client, c.Keys, c.Args)
	}
	return fixedWindowTake.Exec(ctx, client, c.Keys, c.Args)
}

// The SHA1s the calls name, as rueidis computes them for Exec.
var (
	fixedWindowTakeSHA = sha1Hex(fixedWindowTakeSrc)
	fixedWindowPeekSHA = sha1Hex(fixedWindowPeekSrc)
)

func sha1Hex(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// ExecMulti sends calls in one DoMulti, so rueidis writes them to Redis
// together, and returns their results in order, for ParseTake and
// ParsePeek.
//
// Not rueidis's Lua.ExecMulti: it runs SCRIPT LOAD on every node before
// each batch, one more round trip per batch. Here each call is an EVALSHA
// (EVALSHA_RO for a peek), as Exec sends it; a call that Redis did not run
// because it does not know the script (NOSCRIPT) or, for a peek, cannot
// compile its flags line or knows no EVALSHA_RO (the embedded store,
// Redis 6) is sent again alone
// through Exec, which falls back as the single path does. Neither refusal
// runs anything, so sending again never applies a take twice.
func ExecMulti(ctx context.Context, client rueidis.Client, calls []Call) []rueidis.RedisResult {
	cmds := make(rueidis.Commands, len(calls))
	for i, c := range calls {
		if c.peek {
			cmds[i] = client.B().EvalshaRo().Sha1(fixedWindowPeekSHA).Numkeys(int64(len(c.Keys))).Key(c.Keys...).Arg(c.Args...).Build()
		} else {
			cmds[i] = client.B().Evalsha().Sha1(fixedWindowTakeSHA).Numkeys(int64(len(c.Keys))).Key(c.Keys...).Arg(c.Args...).Build()
		}
	}
	res := client.DoMulti(ctx, cmds...)
	for i, c := range calls {
		re, ok := rueidis.IsRedisErr(res[i].Error())
		if ok && (re.IsNoScript() || c.peek && (strings.HasPrefix(re.Error(), "Error compiling script") || strings.HasPrefix(re.Error(), "ERR unknown command"))) {
			res[i] = c.Exec(ctx, client)
		}
	}
	return res
}
