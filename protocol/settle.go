package protocol

import (
	"strconv"

	"quotad/limits"
)

// maxLimitText is limits.MaxLimit in messages.
var maxLimitText = strconv.Itoa(limits.MaxLimit)

// validateSettle: a settle names the accepted take by its request_id and
// gives its actual cost, which may be 0 (a refund) and above the limit (the
// work is done).
func (r *Request) validateSettle() error {
	if r.fields&fieldRequestID == 0 {
		return invalid("settle needs the request_id of the take it settles")
	}
	if !limits.ValidRequestID(r.RequestID) {
		return invalid(limits.RequestIDRule)
	}
	if r.fields&fieldCost == 0 {
		return invalid("settle needs the cost the take actually had: 0 (a refund) to " + maxLimitText)
	}
	if r.Cost < 0 || r.Cost > limits.MaxLimit {
		return invalid("a settle's cost must be an integer from 0 to " + maxLimitText)
	}
	return nil
}

// SettleReply is the answer to a settle: take-shaped, with the state after
// it. A settle of a take the state does not hold (its window ended, it
// slid out, the bucket forgot it, it was never accepted) is not an error:
// Settled false, nothing changed.
type SettleReply struct {
	Settled bool
	// Replay: settled before with the same cost; nothing changed now.
	Replay bool
	// Reserved is the cost the take reserved; 0 when not Settled.
	Reserved     int64
	Limit        int64
	Used         int64
	Remaining    int64
	ResetMS      int64
	RetryAfterMS int64 // what a take of cost 1 would be told now
	// Headers, when not nil, are written as the reply's last field.
	Headers *HeaderFields
}

// AppendSettle appends the reply line (with its '\n') to dst.
func AppendSettle(dst, id []byte, r SettleReply) []byte {
	dst = appendHead(dst, id, true)
	dst = appendBool(dst, `,"settled":`, r.Settled)
	dst = appendBool(dst, `,"replay":`, r.Replay)
	dst = appendInt(dst, `,"reserved":`, r.Reserved)
	dst = appendInt(dst, `,"limit":`, r.Limit)
	dst = appendInt(dst, `,"used":`, r.Used)
	dst = appendInt(dst, `,"remaining":`, r.Remaining)
	dst = appendInt(dst, `,"reset_ms":`, r.ResetMS)
	dst = appendInt(dst, `,"retry_after_ms":`, r.RetryAfterMS)
	dst = appendHeaders(dst, r.Headers)
	return append(dst, "}\n"...)
}
