package protocol

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// TakeReply is the answer to a take. A denial is a reply (Allowed false),
// not an error.
type TakeReply struct {
	Allowed      bool
	Replay       bool
	Limit        int64
	Used         int64 // after this decision; for a replay, at the original acceptance
	Remaining    int64
	ResetMS      int64 // until the window ends, from Redis's PTTL
	RetryAfterMS int64 // 0 when allowed
	LeaseMS      int64 // a granted concurrency lease's life; 0 omits the field
	// Degraded: Redis could not decide and the policy's on_unavailable
	// answered instead. Written only when true.
	Degraded bool
	// Shadow: the policy is in shadow mode, so Allowed is always true and
	// ShadowAllowed is the verdict an enforced policy would have given.
	// Both are written only when Shadow is set.
	Shadow        bool
	ShadowAllowed bool
	// Local: the sidecar allowed the take from units it had reserved in
	// Redis (an allotment), without a Redis call of its own; Used and
	// Remaining are its knowledge as of its latest reservation. Written
	// only when true.
	Local bool
	// Headers, when not nil, are written as the reply's last field.
	Headers *HeaderFields
}

// PeekReply is the answer to a peek.
type PeekReply struct {
	Limit     int64
	Used      int64
	Remaining int64
	ResetMS   int64
	// Headers, when not nil, are written as the reply's last field.
	Headers *HeaderFields
}

// PingReply is the answer to a ping.
type PingReply struct {
	Store   string // "redis" or "embedded"
	RedisOK bool   // Redis answered the sidecar's last call or probe
	Version string
	// Ready: not draining, Redis answering and the decision scripts loaded
	// in it; what a readiness probe wants to know.
	Ready bool
	// RedisError is why Redis was last found down; empty while it is up.
	RedisError string
}

// Replies are written by hand rather than with encoding/json: the field
// order is fixed, nothing is allocated on the hot path, and the id is echoed
// byte for byte.

// AppendTake appends the reply line (with its '\n') to dst. id is the raw
// JSON text of the request's id (Request.ID); nil or empty omits it.
func AppendTake(dst, id []byte, r TakeReply) []byte {
	dst = appendHead(dst, id, true)
	dst = appendBool(dst, `,"allowed":`, r.Allowed)
	dst = appendBool(dst, `,"replay":`, r.Replay)
	dst = appendInt(dst, `,"limit":`, r.Limit)
	dst = appendInt(dst, `,"used":`, r.Used)
	dst = appendInt(dst, `,"remaining":`, r.Remaining)
	dst = appendInt(dst, `,"reset_ms":`, r.ResetMS)
	dst = appendInt(dst, `,"retry_after_ms":`, r.RetryAfterMS)
	if r.LeaseMS > 0 {
		dst = appendInt(dst, `,"lease_ms":`, r.LeaseMS)
	}
	if r.Shadow {
		dst = appendBool(dst, `,"shadow":`, true)
		dst = appendBool(dst, `,"shadow_allowed":`, r.ShadowAllowed)
	}
	if r.Degraded {
		dst = append(dst, `,"degraded":true`...)
	}
	if r.Local {
		dst = append(dst, `,"local":true`...)
	}
	dst = appendHeaders(dst, r.Headers)
	return append(dst, "}\n"...)
}

// AppendPeek appends the reply line (with its '\n') to dst.
func AppendPeek(dst, id []byte, r PeekReply) []byte {
	dst = appendHead(dst, id, true)
	dst = appendInt(dst, `,"limit":`, r.Limit)
	dst = appendInt(dst, `,"used":`, r.Used)
	dst = appendInt(dst, `,"remaining":`, r.Remaining)
	dst = appendInt(dst, `,"reset_ms":`, r.ResetMS)
	dst = appendHeaders(dst, r.Headers)
	return append(dst, "}\n"...)
}

// AppendPing appends the reply line (with its '\n') to dst.
func AppendPing(dst, id []byte, r PingReply) []byte {
	dst = appendHead(dst, id, true)
	dst = append(dst, `,"store":`...)
	dst = appendString(dst, r.Store)
	dst = appendBool(dst, `,"redis_ok":`, r.RedisOK)
	dst = append(dst, `,"version":`...)
	dst = appendString(dst, r.Version)
	dst = appendBool(dst, `,"ready":`, r.Ready)
	if r.RedisError != "" {
		dst = append(dst, `,"redis_error":`...)
		dst = appendString(dst, r.RedisError)
	}
	return append(dst, "}\n"...)
}

// AppendError appends an error reply line (with its '\n') to dst.
func AppendError(dst, id []byte, code Code, message string) []byte {
	dst = appendHead(dst, id, false)
	dst = append(dst, `,"error":`...)
	dst = appendString(dst, string(code))
	dst = append(dst, `,"message":`...)
	dst = appendString(dst, message)
	return append(dst, "}\n"...)
}

// AppendErr appends the error reply for err: the code and message of the
// *Error it is or wraps, INTERNAL and its text otherwise. A caller that adds
// context with %w keeps the client's code.
func AppendErr(dst, id []byte, err error) []byte {
	if e, ok := errors.AsType[*Error](err); ok {
		return AppendError(dst, id, e.Code, e.Message)
	}
	return AppendError(dst, id, CodeInternal, err.Error())
}

// appendHead writes the id only when there is one: an empty id would make
// the line invalid JSON.
func appendHead(dst, id []byte, ok bool) []byte {
	dst = append(dst, '{')
	if len(id) > 0 {
		dst = append(dst, `"id":`...)
		dst = append(dst, id...)
		dst = append(dst, ',')
	}
	return appendBool(dst, `"ok":`, ok)
}

func appendBool(dst []byte, key string, v bool) []byte {
	dst = append(dst, key...)
	return strconv.AppendBool(dst, v)
}

func appendInt(dst []byte, key string, v int64) []byte {
	dst = append(dst, key...)
	return strconv.AppendInt(dst, v, 10)
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string. Invalid UTF-8 becomes U+FFFD so
// that every reply is valid UTF-8 JSON.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20 || c == 0x7f:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, "\ufffd"...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
