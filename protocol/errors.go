package protocol

import "errors"

// Code is a stable machine-readable error code carried in the "error" field
// of an error reply. Codes are part of the public contract: new ones may be
// added, existing ones never change meaning.
type Code string

const (
	// CodeInvalid: the line is not a valid request (bad JSON, wrong types,
	// non-integers, out-of-range values, unknown op, bad addressing).
	CodeInvalid Code = "INVALID"
	// CodeTooLarge: the line is longer than the sidecar's max line bytes.
	CodeTooLarge Code = "TOO_LARGE"
	// CodeUnknownPolicy: the named policy is not in the sidecar's config.
	CodeUnknownPolicy Code = "UNKNOWN_POLICY"
	// CodeConflict: the request_id was accepted before with another cost.
	CodeConflict Code = "CONFLICT"
	// CodePolicy: inline limits differ from the live window's limits.
	CodePolicy Code = "POLICY"
	// CodeWrongType: the quota key holds something quotad did not write.
	CodeWrongType Code = "WRONGTYPE"
	// CodeRequestIDsFull: the window holds as many request_id records as its
	// policy allows; a new request_id cannot be made idempotent.
	CodeRequestIDsFull Code = "REQUEST_IDS_FULL"
	// CodeUnavailable: Redis could not be reached or did not answer in time.
	// For a take the outcome is unknown: retry with the same request_id.
	CodeUnavailable Code = "UNAVAILABLE"
	// CodeShuttingDown: the sidecar is draining and did not run the request
	// to completion. For a take the outcome is unknown.
	CodeShuttingDown Code = "SHUTTING_DOWN"
	// CodeInternal: a bug or an unexpected reply; the message says more.
	CodeInternal Code = "INTERNAL"
)

// Error is an error that maps to an error reply on the wire.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, ErrTooLarge) matches any TOO_LARGE error.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// Errorf-free constructor kept small on purpose: messages are fixed strings
// or built by the caller.
func newError(code Code, msg string) *Error { return &Error{Code: code, Message: msg} }

// ErrTooLarge is returned by LineReader.ReadLine for a line longer than its
// limit. The rest of that line has been discarded; the next call reads the
// next line.
var ErrTooLarge = newError(CodeTooLarge, "line exceeds the maximum line length")

// ErrInvalid matches every INVALID error returned by Decode.
var ErrInvalid = newError(CodeInvalid, "invalid request")
