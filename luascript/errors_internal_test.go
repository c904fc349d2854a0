package luascript

import (
	"errors"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"quotad/limits"
)

func miniClient(t *testing.T) (*miniredis.Miniredis, rueidis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{m.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return m, c
}

// Only the scripts' own replies become *Error; Redis's WRONGTYPE has no
// quotad meaning and must reach the caller as an ordinary failure.
func TestReplyErrorKeepsRedisOwnErrorsUntyped(t *testing.T) {
	m, c := miniClient(t)
	if err := m.Set("s", "v"); err != nil {
		t.Fatal(err)
	}
	serverErr := c.Do(t.Context(), c.B().Hget().Key("s").Field("f").Build()).Error()
	if serverErr == nil || !strings.HasPrefix(serverErr.Error(), "WRONGTYPE ") {
		t.Fatalf("HGET on a string = %v, want Redis's WRONGTYPE", serverErr)
	}
	err := replyError("op", serverErr)
	var typed *Error
	if errors.As(err, &typed) || !errors.Is(err, serverErr) || err.Error() != "op: "+serverErr.Error() {
		t.Fatalf("replyError(%v) = %v, want it wrapped with op", serverErr, err)
	}

	for _, script := range []string{
		"return redis.error_reply('CONFLICT request id was accepted with cost 2')",
		"return redis.error_reply('WRONGTYPE " + notWindow + ": it holds another type')",
	} {
		rerr := c.Do(t.Context(), c.B().Eval().Script(script).Numkeys(0).Build()).Error()
		if err := replyError("op", rerr); !errors.As(err, &typed) || typed.Message == "" {
			t.Errorf("replyError(%v) = %v, want a typed error with a message", rerr, err)
		}
	}
}

// A script that answers with the wrong shape is a bug or a different script
// under the same name, never a decision.
func TestMalformedReplies(t *testing.T) {
	_, c := miniClient(t)
	orig := algorithms[limits.FixedWindow]
	t.Cleanup(func() { algorithms[limits.FixedWindow] = orig })
	answer := func(body string) {
		alg := orig
		alg.take = newScript("test.lua", body, &fixedWindowTakeContract)
		algorithms[limits.FixedWindow] = alg
	}
	a := Args{Key: "k", Limit: 5, WindowMS: 1000, Cost: 1, MaxRequestIDs: 10}

	for _, body := range []string{
		"return nil",
		"return 1",
		"return {1, 0, 2, 3, 1000, 0}",
		"return {1, 0, 2, 3, 1000, 0, 0, 0}",
		"return {1, 0, '2', 3, 1000, 0, 0}",
		"return {2, 0, 2, 3, 1000, 0, 0}",
		"return {0, 1, 2, 3, 1000, 0, 0}",
		"return {1, 0, -1, 3, 1000, 0, 0}",
		"return {1, 0, 2, -3, 1000, 0, 0}",
		"return {1, 0, 2, 3, -1, 0, 0}",
		"return {1, 0, 2, 3, 1000, 5, 0}",
		"return {1, 0, 2, 3, 1000, 0, 2}",
	} {
		answer(body)
		if r, err := Take(t.Context(), c, limits.FixedWindow, a); !errors.Is(err, ErrMalformedReply) {
			t.Errorf("%s: take = %+v, %v; want MALFORMED_REPLY", body, r, err)
		}
	}

	answer("return redis.error_reply('ERR boom')")
	_, err := Take(t.Context(), c, limits.FixedWindow, a)
	var typed *Error
	if err == nil || errors.As(err, &typed) {
		t.Fatalf("take with ERR reply = %v, want an untyped error", err)
	}
}

func TestErrorIs(t *testing.T) {
	err := error(&Error{Code: CodeConflict, Message: "x"})
	if !errors.Is(err, ErrConflict) || errors.Is(err, ErrPolicy) {
		t.Fatalf("errors.Is mismatch for %v", err)
	}
}
