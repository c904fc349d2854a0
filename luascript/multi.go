package luascript

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// Call is one script call, validated and ready to send: which script, its
// keys and its arguments. The builder of each op returns one (TakeCall,
// PeekCall, SettleCall, ReleaseCall, of any algorithm), and the parser of
// the op reads its result (ParseTake, ...). Calls of different scripts
// may share one ExecMulti. The zero Call is not a call: Exec answers an
// error for it.
type Call struct {
	s    *script
	keys []string
	args []string
}

var errZeroCall = errors.New("luascript: zero Call: build calls with TakeCall, PeekCall, ...")

// Key is the call's first key, the one its decision is about ("" for the
// zero Call).
func (c Call) Key() string {
	if len(c.keys) == 0 {
		return ""
	}
	return c.keys[0]
}

// Exec sends the call alone: EVALSHA, with EVAL on NOSCRIPT; a peek is
// EVALSHA_RO, with the fallbacks of readOnlyScript.
func (c Call) Exec(ctx context.Context, client rueidis.Client) rueidis.RedisResult {
	if c.s == nil {
		return rueidis.NewErrorResult(errZeroCall)
	}
	return c.s.exec(ctx, client, c.keys, c.args)
}

// ExecMulti sends calls, of any mix of scripts, in one DoMulti, so rueidis
// writes them to Redis together, and returns their results in order, for
// each call's parser.
//
// Not rueidis's Lua.ExecMulti: it runs SCRIPT LOAD on every node before
// each batch, one more round trip per batch, and takes calls of a single
// script. Here each call is an EVALSHA (EVALSHA_RO for a peek), as Exec
// sends it; a call that Redis did not run because it does not know the
// script (NOSCRIPT) or, for a peek, cannot compile its flags line or knows
// no EVALSHA_RO (the embedded store, Redis 6) is sent again alone through
// Exec, which falls back as the single path does. Neither refusal runs
// anything, so sending again never applies a take twice.
func ExecMulti(ctx context.Context, client rueidis.Client, calls []Call) []rueidis.RedisResult {
	res := make([]rueidis.RedisResult, len(calls))
	cmds := make(rueidis.Commands, 0, len(calls))
	for _, c := range calls {
		switch {
		case c.s == nil:
			continue
		case c.s.peek:
			cmds = append(cmds, client.B().EvalshaRo().Sha1(c.s.sha).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build())
		default:
			cmds = append(cmds, client.B().Evalsha().Sha1(c.s.sha).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build())
		}
	}
	var sent []rueidis.RedisResult
	if len(cmds) > 0 {
		sent = client.DoMulti(ctx, cmds...)
	}
	j := 0
	for i, c := range calls {
		if c.s == nil {
			res[i] = rueidis.NewErrorResult(errZeroCall)
			continue
		}
		res[i] = sent[j]
		j++
		err := res[i].Error()
		if re, ok := rueidis.IsRedisErr(err); ok && re.IsNoScript() || c.s.peek && flagsRefused(err) {
			res[i] = c.Exec(ctx, client)
		}
	}
	return res
}

// decimals holds the text of the policy numbers that calls sent lately (a
// limit, a window, a cap), which the takes of one policy repeat on every
// call, so that they are not formatted and allocated each time. Each slot
// holds one number's text, chosen by a hash of the number, as a pair that
// is replaced whole, so readers take no lock; a number whose slot holds
// another is formatted and takes the slot. A cost, which varies, is
// formatted each time instead.
var decimals [256]atomic.Pointer[decimalText]

type decimalText struct {
	n int64
	s string
}

// decimal is strconv.FormatInt(n, 10), from decimals when it holds n.
func decimal(n int64) string {
	if uint64(n) < 100 {
		return strconv.FormatInt(n, 10) // strconv keeps these: no allocation
	}
	slot := &decimals[(uint64(n)*0x9e3779b97f4a7c15)>>56]
	if d := slot.Load(); d != nil && d.n == n {
		return d.s
	}
	s := strconv.FormatInt(n, 10)
	slot.Store(&decimalText{n: n, s: s})
	return s
}
