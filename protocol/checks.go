package protocol

import (
	"strconv"

	"quotad/limits"
)

// A take of several limits, all or nothing, gives "checks" instead of one
// addressing:
//
//	{"op":"take","request_id":"r-1","cost":1,"checks":[
//	  {"policy":"per-user","subject":"user:42"},
//	  {"policy":"per-tenant","subject":"tenant:7","cost":5}]}
//
// Each check is an object with the addressing fields of a take of one
// limit (policy, or inline limits of any algorithm, and subject) and an
// optional cost, which overrides the take's. The take keeps its own op,
// id, request_id, timeout_ms and headers; a check that gives one of them,
// or checks, is INVALID. Decode gives each check as a Request of op take
// with the take's cost (or its own), request_id and headers, so that it
// validates and resolves as a take of one limit would.

// checkFields are the fields a check may give.
const checkFields = fieldSubject | fieldPolicy | fieldLimit | fieldWindowMS | fieldCost | algorithmFields

// checks decodes the value of "checks": an array of objects. Like the
// other fields, a value of the wrong type is kept as a semantic error and
// skipped; a syntax error is returned.
func (d *decoder) checks(r *Request) error {
	if d.peek() != '[' {
		if err := d.skip(0); err != nil {
			return err
		}
		d.fail(invalid("checks must be an array of objects"))
		return nil
	}
	d.pos++
	d.space()
	if d.eat(']') {
		return nil
	}
	for {
		d.space()
		if d.peek() != '{' {
			if err := d.skip(1); err != nil {
				return err
			}
			d.fail(invalid("checks must be an array of objects"))
		} else if err := d.check(r); err != nil {
			return err
		}
		d.space()
		if d.eat(',') {
			continue
		}
		if d.eat(']') {
			return nil
		}
		return invalid("invalid JSON: expected ',' or ']' in checks")
	}
}

// check decodes one check's object into a new element of r.Checks. Its
// keys are its own: a key of the check may also be one of the take.
func (d *decoder) check(r *Request) error {
	if len(r.Checks) == limits.MaxChecks {
		// validateChecks refuses the take; the rest is only scanned.
		d.fail(invalid("checks must hold 1 to " + strconv.Itoa(limits.MaxChecks) + " checks"))
		return d.skip(1)
	}
	seen := d.seen
	defer func() { d.seen, d.key = seen, nil }()
	d.seen = 0
	r.Checks = append(r.Checks, Request{})
	c := &r.Checks[len(r.Checks)-1]
	d.pos++ // '{'
	d.space()
	if d.eat('}') {
		return nil
	}
	for {
		d.space()
		d.key = nil
		key, err := d.objectKey()
		if err != nil {
			return err
		}
		d.key = key
		d.space()
		if !d.eat(':') {
			return invalid("invalid JSON: expected ':' after object key")
		}
		d.space()
		if f := fieldOf(key); f&traceFields != 0 {
			// The trace context is the take's: a check's is ignored.
			if err := d.skip(1); err != nil {
				return err
			}
			r.TraceInvalid = true
		} else if f != 0 && f&checkFields == 0 {
			if err := d.skip(1); err != nil {
				return err
			}
			d.seen |= f
			c.fields |= f
		} else if err := d.field(c, key, nil); err != nil {
			return err
		}
		d.space()
		if d.eat(',') {
			continue
		}
		if d.eat('}') {
			return nil
		}
		return invalid("invalid JSON: expected ',' or '}' in object")
	}
}

// validateChecks validates a take of checks: the take's own fields, then
// each check as a take of one limit, whose errors name it ("check 2:").
func (r *Request) validateChecks() error {
	if r.Op != OpTake {
		return invalid("checks is for take: a " + r.Op.String() + " names one limit")
	}
	if r.fields&(fieldSubject|fieldPolicy|fieldLimit|fieldWindowMS|algorithmFields) != 0 {
		return invalid("give either checks or subject and its limits, not both")
	}
	if len(r.Checks) < 1 || len(r.Checks) > limits.MaxChecks {
		return invalid("checks must hold 1 to " + strconv.Itoa(limits.MaxChecks) + " checks")
	}
	if r.Cost < 1 || r.Cost > limits.MaxLimit {
		return invalid("cost must be an integer from 1 to the limit")
	}
	if r.fields&fieldRequestID != 0 && !limits.ValidRequestID(r.RequestID) {
		return invalid(limits.RequestIDRule)
	}
	if r.fields&fieldTimeoutMS != 0 {
		if err := limits.ValidateTimeout(r.TimeoutMS); err != nil {
			return invalid(err.Error())
		}
	}
	for i := range r.Checks {
		c := &r.Checks[i]
		name := "check " + strconv.Itoa(i+1) + ": "
		if extra := c.fields &^ checkFields; extra != 0 {
			return invalid(name + checkFieldName(extra) + " is the take's, not a field of a check")
		}
		c.Op, c.RequestID, c.Headers = OpTake, r.RequestID, r.Headers
		c.fields |= r.fields & fieldRequestID
		if c.fields&fieldCost == 0 {
			c.Cost = r.Cost
		}
		if err := c.validate(); err != nil {
			if pe, ok := err.(*Error); ok {
				return invalid(name + pe.Message)
			}
			return err
		}
	}
	return nil
}

// checkFieldName names the lowest field of f that a check may not give.
func checkFieldName(f field) string {
	for _, n := range []struct {
		f    field
		name string
	}{
		{fieldID, "id"}, {fieldOp, "op"}, {fieldRequestID, "request_id"}, {fieldTimeoutMS, "timeout_ms"},
		{fieldHeaders, "headers"}, {fieldChecks, "checks"},
	} {
		if f&n.f != 0 {
			return n.name
		}
	}
	return "a field"
}

// ChecksReply is the answer to a take of checks:
//
//	{"id":1,"ok":true,"allowed":false,"replay":false,"retry_after_ms":900,
//	 "checks":[{"allowed":true,"replay":false,"limit":10,"used":3,...},
//	           {"allowed":false,"replay":false,"limit":100,"used":100,...}]}
//
// Checks are in the request's order, each a take reply's decision fields.
type ChecksReply struct {
	// Allowed: every check consumed; false when none did.
	Allowed bool
	// Replay: every check replayed an acceptance of its request_id.
	Replay bool
	// RetryAfterMS is, when denied, the largest retry_after_ms of the
	// checks that denied: the earliest the same take can be accepted.
	RetryAfterMS int64
	// Degraded: Redis could not decide and the checks' on_unavailable
	// answered instead.
	Degraded bool
	Checks   []CheckReply
	// Headers, when not nil, are written as the reply's last field.
	Headers *HeaderFields
}

// CheckReply is one check's part of a ChecksReply: the fields of a
// take reply, in the same order, and Skipped.
type CheckReply struct {
	Allowed       bool
	Replay        bool
	Limit         int64
	Used          int64
	Remaining     int64
	ResetMS       int64
	RetryAfterMS  int64
	LeaseMS       int64 // 0 omits the field
	Shadow        bool  // shadow and shadow_allowed are written only when set
	ShadowAllowed bool
	Degraded      bool // written only when true
	// Skipped: the take was denied without asking Redis about this check
	// (another check's earlier denial still holds), so its use is unknown:
	// used is written as 0 and remaining as the limit.
	Skipped bool
}

// AppendChecks appends the reply line (with its '\n') to dst.
func AppendChecks(dst, id []byte, r ChecksReply) []byte {
	dst = appendHead(dst, id, true)
	dst = appendBool(dst, `,"allowed":`, r.Allowed)
	dst = appendBool(dst, `,"replay":`, r.Replay)
	dst = appendInt(dst, `,"retry_after_ms":`, r.RetryAfterMS)
	if r.Degraded {
		dst = append(dst, `,"degraded":true`...)
	}
	dst = append(dst, `,"checks":[`...)
	for i := range r.Checks {
		if i > 0 {
			dst = append(dst, ',')
		}
		c := &r.Checks[i]
		dst = appendBool(dst, `{"allowed":`, c.Allowed)
		dst = appendBool(dst, `,"replay":`, c.Replay)
		dst = appendInt(dst, `,"limit":`, c.Limit)
		dst = appendInt(dst, `,"used":`, c.Used)
		dst = appendInt(dst, `,"remaining":`, c.Remaining)
		dst = appendInt(dst, `,"reset_ms":`, c.ResetMS)
		dst = appendInt(dst, `,"retry_after_ms":`, c.RetryAfterMS)
		if c.LeaseMS > 0 {
			dst = appendInt(dst, `,"lease_ms":`, c.LeaseMS)
		}
		if c.Shadow {
			dst = appendBool(dst, `,"shadow":`, true)
			dst = appendBool(dst, `,"shadow_allowed":`, c.ShadowAllowed)
		}
		if c.Degraded {
			dst = append(dst, `,"degraded":true`...)
		}
		if c.Skipped {
			dst = append(dst, `,"skipped":true`...)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	dst = appendHeaders(dst, r.Headers)
	return append(dst, "}\n"...)
}
