package luascript_test

import (
	"errors"
	"testing"

	"github.com/redis/rueidis"

	"quotad/luascript"
)

// Each parser accepts only the reply its script sends: any other shape is
// ErrMalformedReply, never a decision, and a script's refusal is its typed
// error.
func TestParsersRefuseOtherReplies(t *testing.T) {
	e := setup(t)
	reply := func(lua string) rueidis.RedisResult {
		return e.c.Do(t.Context(), e.c.B().Eval().Script(lua).Numkeys(0).Build())
	}
	parsers := map[string]func(rueidis.RedisResult) error{
		"ParseTake":    func(r rueidis.RedisResult) error { _, err := luascript.ParseTake(r); return err },
		"ParsePeek":    func(r rueidis.RedisResult) error { _, err := luascript.ParsePeek(r); return err },
		"ParseSettle":  func(r rueidis.RedisResult) error { _, err := luascript.ParseSettle(r); return err },
		"ParseRelease": func(r rueidis.RedisResult) error { _, err := luascript.ParseRelease(r); return err },
	}
	for name, bad := range map[string][]string{
		// {allowed, replay, used, remaining, reset_ms, retry_after_ms, healed}
		"ParseTake": {"return nil", "return {1, 0, 2, 3, 1000, 0}", "return {2, 0, 2, 3, 1000, 0, 0}", "return {0, 1, 2, 3, 1000, 5, 0}",
			"return {1, 0, -1, 3, 1000, 0, 0}", "return {1, 0, 2, -1, 1000, 0, 0}", "return {1, 0, 2, 3, 1000, 5, 0}",
			"return {0, 0, 2, 3, 1000, -1, 0}", "return {1, 0, 2, 3, 1000, 0, 3}"},
		// {exists, used, remaining, reset_ms}
		"ParsePeek": {"return {1, 2, 3}", "return {0, 1, 3, 0}", "return {1, 2, 3, -2}", "return {2, 0, 0, 0}", "return {1, 2, -3, 0}",
			"return {0, 0, 3, -1}"},
		// {settled, replay, reserved, used, remaining, reset_ms, retry_after_ms, healed}
		"ParseSettle": {"return {1, 0, 1, 2, 3, 0, 0}", "return {1, 0, 0, 2, 3, 0, 0, 0}", "return {0, 0, 1, 2, 3, 0, 0, 0}",
			"return {0, 1, 0, 2, 3, 0, 0, 0}", "return {1, 0, 1, 2, -3, 0, 0, 0}", "return {1, 0, 1, 2, 3, -1, 0, 0}"},
		// {released, used}
		"ParseRelease": {"return {2, 0}", "return {1, -1}", "return {1}"},
	} {
		for _, lua := range bad {
			if err := parsers[name](reply(lua)); !errors.Is(err, luascript.ErrMalformedReply) {
				t.Errorf("%s of %q = %v, want MALFORMED_REPLY", name, lua, err)
			}
		}
	}
	for name, parse := range parsers {
		if err := parse(reply("return redis.error_reply('POLICY live window has limit:window_ms 5:1000')")); !errors.Is(err, luascript.ErrPolicy) {
			t.Errorf("%s of a POLICY reply = %v, want POLICY", name, err)
		}
		var typed *luascript.Error
		if err := parse(reply("return redis.error_reply('ERR boom')")); err == nil || errors.As(err, &typed) {
			t.Errorf("%s of an ERR reply = %v, want an untyped error", name, err)
		}
	}
}

// A take's reply may leave out retry_after_ms and healed together, and
// then reads as 0 for both; one of them alone may not be left out.
func TestParseTakeShortReply(t *testing.T) {
	e := setup(t)
	res := e.c.Do(t.Context(), e.c.B().Eval().Script("return {1, 1, 2, 3, 1000}").Numkeys(0).Build())
	r, err := luascript.ParseTake(res)
	want := luascript.Result{Allowed: true, Replay: true, Used: 2, Remaining: 3, ResetMS: 1000}
	if err != nil || r != want {
		t.Fatalf("ParseTake of {1, 1, 2, 3, 1000} = %+v, %v; want %+v", r, err, want)
	}
	res = e.c.Do(t.Context(), e.c.B().Eval().Script("return {1, 0, 2, 3, 1000, 0}").Numkeys(0).Build())
	if _, err := luascript.ParseTake(res); !errors.Is(err, luascript.ErrMalformedReply) {
		t.Fatalf("ParseTake of {1, 0, 2, 3, 1000, 0} = %v, want MALFORMED_REPLY", err)
	}
}
