package protocol

import "bytes"

// Any request may carry the caller's W3C trace context (PROTOCOL.md,
// "Trace context"), as JSON-RPC and MQTT carry it, in two string fields:
//
//	{"op":"take","subject":"user:42","policy":"api",
//	 "traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
//	 "tracestate":"vendor=opaque"}
//
// A trace context never makes a request fail: a field that is not valid
// (malformed, all-zero ids, not a string, given twice, given inside a
// check) is ignored, and TraceInvalid says so, for the sidecar to count.
// The fields change nothing in the reply.

// MaxTraceStateBytes is the longest tracestate kept: the length W3C Trace
// Context asks every vendor to propagate. A longer one is ignored.
const MaxTraceStateBytes = 512

// maxTraceParentBytes bounds a traceparent of a later version, which may
// append fields to version 00's 55 bytes.
const maxTraceParentBytes = 256

// maxTraceStateMembers is W3C's bound on tracestate's list members.
const maxTraceStateMembers = 32

// Trace is a request's trace context. Its zero value is "none": no
// traceparent, or one that was not valid.
type Trace struct {
	TraceID [16]byte
	// ParentID is the caller's span: the parent of the decision's span.
	ParentID [8]byte
	// Flags are the trace flags; bit 0 says the caller sampled its span.
	Flags byte
	// State is the tracestate as given, "" when absent or not valid.
	State string
}

// Valid reports whether the request carried a valid traceparent.
func (t *Trace) Valid() bool { return t.TraceID != [16]byte{} }

// Sampled reports whether the caller sampled its span (trace flags bit 0).
func (t *Trace) Sampled() bool { return t.Flags&1 != 0 }

// ParseTraceParent parses a W3C traceparent header value: version 00's
// "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>", or a later
// version's, which may append "-" and more. Hex is lower case; all-zero
// ids and version ff are not valid.
func ParseTraceParent(s []byte) (t Trace, ok bool) {
	if len(s) < 55 || len(s) > maxTraceParentBytes || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return Trace{}, false
	}
	var version, flags [1]byte
	if !lowerHex(version[:], s[0:2]) || version[0] == 0xff ||
		!lowerHex(t.TraceID[:], s[3:35]) || !lowerHex(t.ParentID[:], s[36:52]) || !lowerHex(flags[:], s[53:55]) {
		return Trace{}, false
	}
	t.Flags = flags[0]
	if version[0] == 0 && len(s) != 55 || len(s) > 55 && s[55] != '-' {
		return Trace{}, false
	}
	if t.TraceID == [16]byte{} || t.ParentID == [8]byte{} {
		return Trace{}, false
	}
	return t, true
}

// lowerHex decodes the lower-case hex src into dst, len(src) == 2*len(dst).
func lowerHex(dst, src []byte) bool {
	for i := range dst {
		hi, ok1 := hexNibble(src[2*i])
		lo, ok2 := hexNibble(src[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func hexNibble(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// ValidTraceState reports whether s is a W3C tracestate of at most
// MaxTraceStateBytes: at most 32 comma-separated key=value members (empty
// ones allowed), each key once, keys of lower-case letters, digits and
// _ - * / (a tenant@system key too), values of printable ASCII but , and =.
func ValidTraceState(s string) bool {
	if len(s) > MaxTraceStateBytes {
		return false
	}
	var keys [maxTraceStateMembers]string
	n := 0
	for rest := s; ; {
		member := rest
		comma := indexByte(rest, ',')
		if comma >= 0 {
			member, rest = rest[:comma], rest[comma+1:]
		}
		member = trimOWS(member)
		if member != "" {
			eq := indexByte(member, '=')
			if eq < 0 || n == maxTraceStateMembers || !traceStateKey(member[:eq]) || !traceStateValue(member[eq+1:]) {
				return false
			}
			for _, k := range keys[:n] {
				if k == member[:eq] {
					return false
				}
			}
			keys[n] = member[:eq]
			n++
		}
		if comma < 0 {
			return true
		}
	}
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// traceStateKey: simple-key, or tenant-id "@" system-id.
func traceStateKey(k string) bool {
	if at := indexByte(k, '@'); at >= 0 {
		tenant, system := k[:at], k[at+1:]
		return len(tenant) >= 1 && len(tenant) <= 241 && keyChars(tenant, true) &&
			len(system) >= 1 && len(system) <= 14 && keyChars(system, false)
	}
	return len(k) >= 1 && len(k) <= 256 && keyChars(k, false)
}

// keyChars: a first character that is a lower-case letter (or a digit,
// for a tenant id), then lower-case letters, digits, _ - * /.
func keyChars(k string, digitFirst bool) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9':
			if i == 0 && !digitFirst {
				return false
			}
		case i > 0 && (c == '_' || c == '-' || c == '*' || c == '/'):
		default:
			return false
		}
	}
	return true
}

// traceStateValue: 1 to 256 printable ASCII characters but , and =, the
// last not a space.
func traceStateValue(v string) bool {
	if len(v) < 1 || len(v) > 256 || v[len(v)-1] == ' ' {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e || c == ',' || c == '=' {
			return false
		}
	}
	return true
}

// traceField decodes traceparent or tracestate (f) into r. Nothing in it
// is an error but what would be one in any field, known or not (the
// line's JSON syntax, a string that is not Unicode): a value that is not
// a valid string of its kind, or a second one, sets TraceInvalid.
func (d *decoder) traceField(r *Request, f field) error {
	dup := d.seen&f != 0
	d.seen |= f
	if !dup && d.isNull() {
		return nil
	}
	str := d.peek() == '"'
	start := d.pos
	if err := d.skip(0); err != nil {
		return err
	}
	switch {
	case dup:
		// Which of the two was meant is unknown: neither is kept.
		r.TraceInvalid = true
		if f == fieldTraceParent {
			r.fields |= fieldTraceDuplicate
		} else {
			r.Trace.State = ""
		}
		return nil
	case !str:
		r.TraceInvalid = true
		return nil
	}
	raw := d.data[start+1 : d.pos-1]
	if bytes.IndexByte(raw, '\\') >= 0 {
		raw = unescape(raw)
	}
	switch f {
	case fieldTraceParent:
		t, ok := ParseTraceParent(raw)
		if !ok {
			r.TraceInvalid = true
			return nil
		}
		t.State = r.Trace.State
		r.Trace = t
	case fieldTraceState:
		st := string(raw)
		if !ValidTraceState(st) {
			r.TraceInvalid = true
			return nil
		}
		r.Trace.State = st
	}
	r.fields |= f
	return nil
}

// settleTrace keeps a trace context only when it is whole: a traceparent
// given once and valid; its tracestate, when valid, goes with it. W3C
// ignores a tracestate without a traceparent.
func (r *Request) settleTrace() {
	if r.fields&fieldTraceParent == 0 || r.fields&fieldTraceDuplicate != 0 {
		r.Trace = Trace{}
	}
}
