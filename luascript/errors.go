package luascript

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
)

// Codes carried by Error. All but CodeMalformedReply are the first word of an
// error reply from the scripts.
const (
	CodeInvalid        = "INVALID"
	CodeConflict       = "CONFLICT"
	CodePolicy         = "POLICY"
	CodeWrongType      = "WRONGTYPE"
	CodeRequestIDsFull = "REQUEST_IDS_FULL"
	CodeMalformedReply = "MALFORMED_REPLY"
)

// Sentinels for errors.Is; they match any *Error with the same Code.
var (
	ErrInvalid        = &Error{Code: CodeInvalid}
	ErrConflict       = &Error{Code: CodeConflict}
	ErrPolicy         = &Error{Code: CodePolicy}
	ErrWrongType      = &Error{Code: CodeWrongType}
	ErrRequestIDsFull = &Error{Code: CodeRequestIDsFull}
	ErrMalformedReply = &Error{Code: CodeMalformedReply}
)

// ErrNotLoaded is the result of a call that Redis did not run because it
// did not hold the script (NOSCRIPT), when the script could not be loaded
// into Redis (Loader) in time to send the call again within its deadline.
// Nothing ran.
var ErrNotLoaded = errors.New("redis did not hold the script and it could not be loaded in time")

// Error is a decision a script refused to make, or a reply no script of
// this package sends (CodeMalformedReply). A refusal means the decision was
// not applied: nothing was written except, possibly, a missing TTL. After a
// malformed reply the outcome is unknown.
type Error struct {
	Code    string
	Message string
	// Healed: before refusing, the script gave the window back the TTL it
	// had lost.
	Healed bool
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + " " + e.Message
}

// Is makes errors.Is(err, ErrConflict) true for every CONFLICT error.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// healedMark ends the message of a refusal that restored a missing TTL.
const healedMark = " TTL_RESTORED"

// notWindow starts the message of the scripts' own WRONGTYPE replies, telling
// them apart from a WRONGTYPE raised by Redis itself: "key is not a quotad
// window", "... token bucket", "... lease set".
const notWindow = "key is not a quotad "

// replyError turns an error reply from one of the scripts into an *Error.
// Anything else (network, context, NOSCRIPT, OOM, Redis's own WRONGTYPE) is
// wrapped with op: whether the script ran is then unknown to the caller.
func replyError(op string, err error) error {
	if rueidis.IsRedisNil(err) {
		return &Error{Code: CodeMalformedReply, Message: op + ": nil reply"}
	}
	if re, ok := rueidis.IsRedisErr(err); ok {
		// Clone: the message may alias the reply's buffer.
		code, msg, _ := strings.Cut(strings.Clone(re.Error()), " ")
		msg, healed := strings.CutSuffix(msg, healedMark)
		switch code {
		case CodeInvalid, CodeConflict, CodePolicy, CodeRequestIDsFull, CodeClockSkew:
			return &Error{Code: code, Message: msg, Healed: healed}
		case CodeWrongType:
			if strings.HasPrefix(msg, notWindow) {
				return &Error{Code: code, Message: msg, Healed: healed}
			}
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

func malformed(op, format string, args ...any) error {
	return &Error{Code: CodeMalformedReply, Message: op + ": " + fmt.Sprintf(format, args...)}
}
