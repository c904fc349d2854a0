package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"quotad/protocol"
)

// parseReply checks that line is one valid JSON object of valid UTF-8
// ending in '\n' with no other newline, and returns its keys in order and
// its values.
func parseReply(t *testing.T, line []byte) (keys []string, values map[string]any) {
	t.Helper()
	body, ok := bytes.CutSuffix(line, []byte("\n"))
	if !ok {
		t.Fatalf("reply %q does not end in a newline", line)
	}
	if bytes.ContainsAny(body, "\r\n") {
		t.Fatalf("reply %q holds a raw line break", line)
	}
	if !utf8.Valid(line) {
		t.Fatalf("reply %q is not valid UTF-8", line)
	}
	if !json.Valid(body) {
		t.Fatalf("reply %q is not valid JSON", line)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("reply %q is not an object", line)
	}
	values = make(map[string]any)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		key := tok.(string)
		if _, dup := values[key]; dup {
			t.Fatalf("reply %q repeats %q", line, key)
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
		values[key] = v
	}
	return keys, values
}

func TestAppendReplies(t *testing.T) {
	tests := []struct {
		name string
		line []byte
		want string // exact bytes, without the newline
		keys []string
	}{
		{
			name: "take, documented example",
			line: protocol.AppendTake(nil, []byte("7"), protocol.TakeReply{
				Allowed: true, Limit: 5, Used: 2, Remaining: 3, ResetMS: 59990,
			}),
			want: `{"id":7,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":59990,"retry_after_ms":0}`,
			keys: []string{"id", "ok", "allowed", "replay", "limit", "used", "remaining", "reset_ms", "retry_after_ms"},
		},
		{
			name: "take denied replay without id",
			line: protocol.AppendTake(nil, nil, protocol.TakeReply{
				Replay: true, Limit: 1000000000, Used: 1000000000, ResetMS: 2678400000, RetryAfterMS: 2678400000,
			}),
			want: `{"ok":true,"allowed":false,"replay":true,"limit":1000000000,"used":1000000000,"remaining":0,"reset_ms":2678400000,"retry_after_ms":2678400000}`,
			keys: []string{"ok", "allowed", "replay", "limit", "used", "remaining", "reset_ms", "retry_after_ms"},
		},
		{
			name: "take degraded by on_unavailable: the field comes last",
			line: protocol.AppendTake(nil, []byte("8"), protocol.TakeReply{
				Allowed: true, Limit: 5, Remaining: 5, Degraded: true,
			}),
			want: `{"id":8,"ok":true,"allowed":true,"replay":false,"limit":5,"used":0,"remaining":5,"reset_ms":0,"retry_after_ms":0,"degraded":true}`,
			keys: []string{"id", "ok", "allowed", "replay", "limit", "used", "remaining", "reset_ms", "retry_after_ms", "degraded"},
		},
		{
			name: "take, shadow policy that would have denied",
			line: protocol.AppendTake(nil, nil, protocol.TakeReply{
				Allowed: true, Limit: 1, Used: 1, ResetMS: 500, Shadow: true, ShadowAllowed: false,
			}),
			want: `{"ok":true,"allowed":true,"replay":false,"limit":1,"used":1,"remaining":0,"reset_ms":500,"retry_after_ms":0,"shadow":true,"shadow_allowed":false}`,
			keys: []string{"ok", "allowed", "replay", "limit", "used", "remaining", "reset_ms", "retry_after_ms", "shadow", "shadow_allowed"},
		},
		{
			name: "peek, documented example",
			line: protocol.AppendPeek(nil, nil, protocol.PeekReply{Limit: 5, Used: 2, Remaining: 3, ResetMS: 41250}),
			want: `{"ok":true,"limit":5,"used":2,"remaining":3,"reset_ms":41250}`,
			keys: []string{"ok", "limit", "used", "remaining", "reset_ms"},
		},
		{
			name: "peek with string id",
			line: protocol.AppendPeek(nil, []byte(`"p-1"`), protocol.PeekReply{Limit: 3, Remaining: 3}),
			want: `{"id":"p-1","ok":true,"limit":3,"used":0,"remaining":3,"reset_ms":0}`,
			keys: []string{"id", "ok", "limit", "used", "remaining", "reset_ms"},
		},
		{
			name: "take with its header fields, denied: the field comes last",
			line: protocol.AppendTake(nil, nil, protocol.TakeReply{
				Limit: 1, Used: 1, ResetMS: 500, RetryAfterMS: 500, Degraded: true,
				Headers: &protocol.HeaderFields{Policy: `"api";q=1;w=1`, RateLimit: `"api";r=0;t=1`, RetryAfter: "1"},
			}),
			want: `{"ok":true,"allowed":false,"replay":false,"limit":1,"used":1,"remaining":0,"reset_ms":500,"retry_after_ms":500,"degraded":true,` +
				`"headers":{"RateLimit-Policy":"\"api\";q=1;w=1","RateLimit":"\"api\";r=0;t=1","Retry-After":"1"}}`,
			keys: []string{"ok", "allowed", "replay", "limit", "used", "remaining", "reset_ms", "retry_after_ms", "degraded", "headers"},
		},
		{
			name: "peek with its header fields, RateLimit left out",
			line: protocol.AppendPeek(nil, []byte("1"), protocol.PeekReply{Limit: 3, Remaining: 3,
				Headers: &protocol.HeaderFields{Policy: `"inline";q=3`}}),
			want: `{"id":1,"ok":true,"limit":3,"used":0,"remaining":3,"reset_ms":0,"headers":{"RateLimit-Policy":"\"inline\";q=3"}}`,
			keys: []string{"id", "ok", "limit", "used", "remaining", "reset_ms", "headers"},
		},
		{
			name: "ping, documented example",
			line: protocol.AppendPing(nil, nil, protocol.PingReply{Store: "redis", RedisOK: true, Version: "v1.0.0", Ready: true}),
			want: `{"ok":true,"store":"redis","redis_ok":true,"version":"v1.0.0","ready":true}`,
			keys: []string{"ok", "store", "redis_ok", "version", "ready"},
		},
		{
			name: "ping embedded",
			line: protocol.AppendPing(nil, []byte(`"p"`), protocol.PingReply{Store: "embedded", Version: "dev"}),
			want: `{"id":"p","ok":true,"store":"embedded","redis_ok":false,"version":"dev","ready":false}`,
			keys: []string{"id", "ok", "store", "redis_ok", "version", "ready"},
		},
		{
			name: "ping with redis down",
			line: protocol.AppendPing(nil, nil, protocol.PingReply{Store: "redis", Version: "dev", RedisError: `not connected to redis: "x"`}),
			want: `{"ok":true,"store":"redis","redis_ok":false,"version":"dev","ready":false,"redis_error":"not connected to redis: \"x\""}`,
			keys: []string{"ok", "store", "redis_ok", "version", "ready", "redis_error"},
		},
		{
			name: "error, documented example",
			line: protocol.AppendError(nil, []byte("7"), protocol.CodeConflict, "request_id was accepted with cost 2"),
			want: `{"id":7,"ok":false,"error":"CONFLICT","message":"request_id was accepted with cost 2"}`,
			keys: []string{"id", "ok", "error", "message"},
		},
		{
			name: "error without id",
			line: protocol.AppendError(nil, nil, protocol.CodeUnknownPolicy, `no policy named "nope" in the config`),
			want: `{"ok":false,"error":"UNKNOWN_POLICY","message":"no policy named \"nope\" in the config"}`,
			keys: []string{"ok", "error", "message"},
		},
		{
			name: "ErrTooLarge",
			line: protocol.AppendErr(nil, nil, protocol.ErrTooLarge),
			want: `{"ok":false,"error":"TOO_LARGE","message":"line exceeds the maximum line length"}`,
			keys: []string{"ok", "error", "message"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, _ := parseReply(t, tt.line)
			if got := strings.TrimSuffix(string(tt.line), "\n"); got != tt.want {
				t.Errorf("reply\n got %s\nwant %s", got, tt.want)
			}
			if fmt.Sprint(keys) != fmt.Sprint(tt.keys) {
				t.Errorf("key order %v, want %v", keys, tt.keys)
			}
		})
	}
}

// The decoded values, not just the bytes: a client using encoding/json sees
// what the sidecar meant.
func TestAppendTakeValues(t *testing.T) {
	in := protocol.TakeReply{Allowed: false, Replay: false, Limit: 10, Used: 10, Remaining: 0, ResetMS: 1234, RetryAfterMS: 1234}
	var got protocol.Reply
	if err := json.Unmarshal(protocol.AppendTake(nil, []byte(`"a"`), in), &got); err != nil {
		t.Fatal(err)
	}
	want := protocol.Reply{ID: json.RawMessage(`"a"`), OK: true, Limit: 10, Used: 10, ResetMS: 1234, RetryAfterMS: 1234}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("decoded\n got %+v\nwant %+v", got, want)
	}
	if err := got.Err(); err != nil {
		t.Errorf("Err() of an ok reply = %v", err)
	}
}

// The id is copied byte for byte: a client matches replies by comparing
// exactly what it sent.
func TestAppendEchoesIDVerbatim(t *testing.T) {
	ids := []string{
		`0`, `7`, `-1`, `-0`, `1.50`, `-1.5e+3`, `1E400`, `99999999999999999999999`,
		`""`, `"a"`, `"a\"b"`, `"\u00e9"`, `"é"`, `"\ud800"`, `"a\/b"`, `"\\"`,
	}
	for _, id := range ids {
		lines := map[string][]byte{
			"take":  protocol.AppendTake(nil, []byte(id), protocol.TakeReply{}),
			"peek":  protocol.AppendPeek(nil, []byte(id), protocol.PeekReply{}),
			"ping":  protocol.AppendPing(nil, []byte(id), protocol.PingReply{}),
			"error": protocol.AppendError(nil, []byte(id), protocol.CodeInvalid, "m"),
			"err":   protocol.AppendErr(nil, []byte(id), errors.New("m")),
		}
		for kind, line := range lines {
			keys, _ := parseReply(t, line)
			if len(keys) == 0 || keys[0] != "id" {
				t.Errorf("%s reply %q does not start with the id", kind, line)
			}
			if want := `{"id":` + id + `,"ok":`; !bytes.HasPrefix(line, []byte(want)) {
				t.Errorf("%s reply %q does not start with %s", kind, line, want)
			}
			var r protocol.Reply
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatal(err)
			}
			if string(r.ID) != id {
				t.Errorf("%s reply: client sees id %s, want %s", kind, r.ID, id)
			}
		}
	}
}

// A nil id and an empty one both mean "no id": the reply must stay valid
// JSON rather than read {"id":,"ok":...}.
func TestAppendEmptyIDOmitted(t *testing.T) {
	for _, id := range [][]byte{nil, {}} {
		line := protocol.AppendPing(nil, id, protocol.PingReply{Store: "redis"})
		keys, _ := parseReply(t, line)
		if keys[0] != "ok" {
			t.Errorf("id %#v: reply %q, want no id field", id, line)
		}
	}
}

func TestAppendErrorEscapesMessage(t *testing.T) {
	messages := []string{
		"",
		"plain",
		`quote " and backslash \ and slash /`,
		"newline \n carriage return \r tab \t",
		"NUL \x00 and \x01 \x1f DEL \x7f",
		"U+2028 \u2028 U+2029 \u2029",
		"non-ASCII é € 😀",
		"invalid \xff byte",
		"invalid \xc0\xaf overlong",
		"encoded surrogate \xed\xa0\x80",
		"truncated at end \xe2\x82",
		"\xe2\x82",
		"\x80\x80\x80",
		"U+FFFD itself \ufffd",
		"html <script>&</script>",
		strings.Repeat(`"\`, 1000),
	}
	for _, msg := range messages {
		line := protocol.AppendError(nil, []byte(`"x"`), protocol.CodeInternal, msg)
		_, values := parseReply(t, line)
		// encoding/json replaces each invalid byte with U+FFFD, as a
		// client in any language would see a replacement character.
		canon, _ := json.Marshal(msg)
		var want string
		if err := json.Unmarshal(canon, &want); err != nil {
			t.Fatal(err)
		}
		if got := values["message"]; got != want {
			t.Errorf("message %q came back as %q, want %q", msg, got, want)
		}
		if values["error"] != "INTERNAL" || values["ok"] != false {
			t.Errorf("reply %q: wrong error or ok", line)
		}
	}
}

func TestAppendPingEscapes(t *testing.T) {
	line := protocol.AppendPing(nil, nil, protocol.PingReply{Store: "re\"dis\n", Version: "v\xff1"})
	_, values := parseReply(t, line)
	if values["store"] != "re\"dis\n" || values["version"] != "v\ufffd1" {
		t.Errorf("reply %q decoded to %v", line, values)
	}
}

func TestAppendErr(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode protocol.Code
		wantMsg  string
	}{
		{"protocol error", &protocol.Error{Code: protocol.CodeConflict, Message: "cost differs"}, protocol.CodeConflict, "cost differs"},
		{"ErrTooLarge", protocol.ErrTooLarge, protocol.CodeTooLarge, protocol.ErrTooLarge.Message},
		{"plain error", errors.New("redis said \"no\""), protocol.CodeInternal, `redis said "no"`},
		{"wrapped protocol error", fmt.Errorf("decode: %w", &protocol.Error{Code: protocol.CodeInvalid, Message: "subject is required"}),
			protocol.CodeInvalid, "subject is required"},
		{"joined protocol error", errors.Join(errors.New("context"), &protocol.Error{Code: protocol.CodeUnavailable, Message: "redis timeout"}),
			protocol.CodeUnavailable, "redis timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line := protocol.AppendErr(nil, []byte("3"), tt.err)
			keys, values := parseReply(t, line)
			if fmt.Sprint(keys) != "[id ok error message]" {
				t.Errorf("keys %v", keys)
			}
			if values["error"] != string(tt.wantCode) || values["message"] != tt.wantMsg || values["ok"] != false {
				t.Errorf("AppendErr(%v) = %q, want code %s message %q", tt.err, line, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

// Append* append: what is already in dst stays, so a writer can batch
// replies in one buffer.
func TestAppendKeepsPrefix(t *testing.T) {
	buf := make([]byte, 0, 1024)
	buf = protocol.AppendPing(buf, []byte("1"), protocol.PingReply{Store: "redis"})
	buf = protocol.AppendTake(buf, []byte("2"), protocol.TakeReply{Allowed: true})
	buf = protocol.AppendPeek(buf, []byte("3"), protocol.PeekReply{})
	buf = protocol.AppendError(buf, []byte("4"), protocol.CodeInvalid, "x")
	buf = protocol.AppendErr(buf, []byte("5"), protocol.ErrTooLarge)
	lines := bytes.SplitAfter(buf, []byte("\n"))
	if len(lines) != 6 || len(lines[5]) != 0 {
		t.Fatalf("batch %q: want 5 lines", buf)
	}
	for i, line := range lines[:5] {
		parseReply(t, line)
		if want := fmt.Sprintf(`{"id":%d,`, i+1); !bytes.HasPrefix(line, []byte(want)) {
			t.Errorf("line %d = %q", i, line)
		}
	}
}

// Every code a reply can carry reads back through Reply.Err as an error
// that matches by code.
func TestReplyErr(t *testing.T) {
	codes := []protocol.Code{
		protocol.CodeInvalid, protocol.CodeTooLarge, protocol.CodeUnknownPolicy, protocol.CodeConflict,
		protocol.CodePolicy, protocol.CodeWrongType, protocol.CodeRequestIDsFull, protocol.CodeUnavailable,
		protocol.CodeShuttingDown, protocol.CodeInternal,
	}
	for _, code := range codes {
		var r protocol.Reply
		if err := json.Unmarshal(protocol.AppendError(nil, nil, code, "m"), &r); err != nil {
			t.Fatal(err)
		}
		err := r.Err()
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != code || pe.Message != "m" {
			t.Errorf("code %s: Err() = %#v", code, err)
		}
		if !errors.Is(err, &protocol.Error{Code: code}) {
			t.Errorf("code %s: Err() does not match its code", code)
		}
		if (code == protocol.CodeInvalid) != errors.Is(err, protocol.ErrInvalid) {
			t.Errorf("code %s: errors.Is(err, ErrInvalid) wrong", code)
		}
	}
}
