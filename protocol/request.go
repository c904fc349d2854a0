package protocol

import (
	"strconv"
	"unicode"
	"unicode/utf8"

	"quotad/limits"
)

// Op is a request's operation.
type Op uint8

const (
	OpUnknown Op = iota
	OpTake
	OpPeek
	OpPing
	OpRelease
	OpSettle
)

func (o Op) String() string {
	switch o {
	case OpTake:
		return "take"
	case OpPeek:
		return "peek"
	case OpPing:
		return "ping"
	case OpRelease:
		return "release"
	case OpSettle:
		return "settle"
	}
	return "unknown"
}

// maxNesting bounds the depth of JSON the decoder skips. The bounds of the
// request's fields are package limits' (MaxSubjectBytes, MaxLimit, ...).
const maxNesting = 32

// idRule is the message of an id longer than limits.MaxIDBytes.
var idRule = "id must be at most " + strconv.Itoa(limits.MaxIDBytes) + " bytes"

// Request is a decoded, syntactically valid request. Fields that were absent
// (or null) are zero; Has reports which ones were given.
type Request struct {
	// ID is the raw JSON text of the "id" field (a string with its quotes,
	// or a number), echoed verbatim in the reply; nil when absent.
	ID        []byte
	Op        Op
	Subject   string
	Policy    string
	Limit     int64
	WindowMS  int64
	Cost      int64 // 1 when absent
	RequestID string
	TimeoutMS int64
	fields    field
	// Inline limits of the other algorithms (algorithm.go). Algorithm is ""
	// when absent, which means fixed_window; Burst is Rate when absent.
	Algorithm string
	Rate      int64
	PeriodMS  int64
	Burst     int64
	LeaseMS   int64
	// Headers: the reply of a take or peek carries the RateLimit header
	// fields of its decision (headers.go).
	Headers bool
	// Inline limits of a calendar window (calendar.go): TimeZone and
	// WeekStart are "" when absent, which mean UTC and monday.
	Period    string
	TimeZone  string
	WeekStart string
	JitterMS  int64
	// Checks are the limits of a take of several limits, all or nothing
	// (checks.go); nil for a take of one.
	Checks []Request
	// Trace is the caller's trace context (trace.go), zero when the
	// request carried none or an invalid one; TraceInvalid says that it
	// carried a trace field that is ignored.
	Trace        Trace
	TraceInvalid bool
}

type field uint32

const (
	fieldID field = 1 << iota
	fieldOp
	fieldSubject
	fieldPolicy
	fieldLimit
	fieldWindowMS
	fieldCost
	fieldRequestID
	fieldTimeoutMS
	fieldAlgorithm
	fieldRate
	fieldPeriodMS
	fieldBurst
	fieldLeaseMS
	fieldHeaders
	fieldPeriod
	fieldTimeZone
	fieldWeekStart
	fieldJitterMS
	fieldChecks
	fieldTraceParent
	fieldTraceState
	// fieldTraceDuplicate: traceparent was given twice (trace.go).
	fieldTraceDuplicate
)

// traceFields are the trace context's fields, which no value makes an
// error (trace.go).
const traceFields = fieldTraceParent | fieldTraceState

// HasInline reports whether the request gave inline limits, of any
// algorithm.
func (r *Request) HasInline() bool { return r.fields&(fieldLimit|fieldWindowMS|algorithmFields) != 0 }

// Decode parses one line into r, reusing r's ID buffer. It checks JSON
// syntax, field types, integer ranges and the addressing rules of each op;
// whether a named policy exists is for the caller. Every failure is an
// *Error with CodeInvalid; r.ID is set whenever the object was well formed
// enough to find it, so the error reply can echo it.
func Decode(line []byte, r *Request) error {
	idBuf, checks := r.ID[:0], r.Checks[:0]
	*r = Request{Cost: 1, Checks: checks}
	d := decoder{data: line}
	if err := d.object(r, idBuf); err != nil {
		return err
	}
	if d.err != nil {
		return d.err
	}
	r.settleTrace()
	return r.validate()
}

func (r *Request) validate() error {
	switch r.Op {
	case OpPing:
		return nil
	case OpTake, OpPeek, OpRelease, OpSettle:
	default:
		return invalid("op is required: one of take, peek, release, settle, ping")
	}
	if r.fields&fieldChecks != 0 {
		return r.validateChecks()
	}
	if r.fields&fieldSubject == 0 {
		return invalid("subject is required")
	}
	if err := limits.ValidateSubject(r.Subject); err != nil {
		return invalid(err.Error())
	}
	for _, c := range r.Subject {
		if unicode.IsControl(c) {
			return invalid("subject must not contain control characters")
		}
	}
	hasPolicy := r.fields&fieldPolicy != 0
	switch {
	case r.fields&algorithmFields != 0:
		if err := r.validateAlgorithm(hasPolicy); err != nil {
			return err
		}
	case hasPolicy && r.HasInline():
		return invalid("give either policy or limit and window_ms, not both")
	case hasPolicy:
		if !limits.ValidPolicyName(r.Policy) {
			return invalid("policy must be " + limits.PolicyNameChars)
		}
	case r.fields&fieldLimit == 0 || r.fields&fieldWindowMS == 0:
		return invalid("give policy, or both limit and window_ms")
	default:
		if err := limits.ValidateFixedWindow(r.Limit, r.WindowMS); err != nil {
			return invalid(err.Error())
		}
	}
	if r.Op == OpTake {
		// cost and request_id mean nothing to a peek, which ignores them.
		if r.Cost < 1 || r.Cost > limits.MaxLimit {
			return invalid("cost must be an integer from 1 to the limit")
		}
		if r.fields&fieldRequestID != 0 && !limits.ValidRequestID(r.RequestID) {
			return invalid(limits.RequestIDRule)
		}
	}
	if r.Op == OpRelease && r.Headers {
		return invalid("headers is for take and peek: a release decides no quota")
	}
	if r.Op == OpRelease {
		if err := r.validateRelease(); err != nil {
			return err
		}
	}
	if r.Op == OpSettle {
		if err := r.validateSettle(); err != nil {
			return err
		}
	}
	if r.fields&fieldTimeoutMS != 0 {
		if err := limits.ValidateTimeout(r.TimeoutMS); err != nil {
			return invalid(err.Error())
		}
	}
	return nil
}

func invalid(msg string) error { return newError(CodeInvalid, msg) }

// decoder is a small validating JSON scanner specialised for the request
// object: known fields are decoded in place, others are checked for syntax
// and skipped. Keys match exactly (encoding/json would match "OP" to "op").
//
// A syntax error stops the scan at once and is returned. A semantic error (a
// wrong type, an unknown op, a duplicate field) is kept in err and the scan
// goes on, so that an "id" after the faulty field is still found and echoed.
type decoder struct {
	data []byte
	pos  int
	seen field // known keys met so far, null or not, to catch duplicates
	err  error // first semantic error
	// key is the top-level member whose value is being scanned, nil while
	// a top-level key itself is; it names the field in string errors.
	key []byte
	// notUnicode is set when a string scanned was not valid Unicode.
	notUnicode bool
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) object(r *Request, idBuf []byte) error {
	d.space()
	if !d.eat('{') {
		return invalid("request must be a JSON object")
	}
	d.space()
	if d.eat('}') {
		return d.end()
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
		if err := d.field(r, key, idBuf); err != nil {
			return err
		}
		d.space()
		if d.eat(',') {
			continue
		}
		if d.eat('}') {
			return d.end()
		}
		return invalid("invalid JSON: expected ',' or '}' in object")
	}
}

func (d *decoder) end() error {
	d.space()
	if d.pos != len(d.data) {
		return invalid("invalid JSON: data after the request object")
	}
	return nil
}

// objectKey returns the object key; the common case (no escapes) aliases
// the line.
func (d *decoder) objectKey() ([]byte, error) {
	if d.peek() != '"' {
		return nil, invalid("invalid JSON: expected a string as object key")
	}
	raw, escaped, err := d.scanString()
	if err != nil {
		return nil, err
	}
	if !escaped {
		return raw, nil
	}
	return unescape(raw), nil
}

// fieldOf is the known field named key, 0 for an unknown key.
func fieldOf(key []byte) field {
	switch string(key) {
	case "id":
		return fieldID
	case "op":
		return fieldOp
	case "subject":
		return fieldSubject
	case "policy":
		return fieldPolicy
	case "limit":
		return fieldLimit
	case "window_ms":
		return fieldWindowMS
	case "cost":
		return fieldCost
	case "request_id":
		return fieldRequestID
	case "timeout_ms":
		return fieldTimeoutMS
	case "algorithm":
		return fieldAlgorithm
	case "rate":
		return fieldRate
	case "period_ms":
		return fieldPeriodMS
	case "burst":
		return fieldBurst
	case "lease_ms":
		return fieldLeaseMS
	case "headers":
		return fieldHeaders
	case "period":
		return fieldPeriod
	case "time_zone":
		return fieldTimeZone
	case "week_start":
		return fieldWeekStart
	case "jitter_ms":
		return fieldJitterMS
	case "checks":
		return fieldChecks
	case "traceparent":
		return fieldTraceParent
	case "tracestate":
		return fieldTraceState
	}
	return 0
}

func (d *decoder) field(r *Request, key []byte, idBuf []byte) error {
	f := fieldOf(key)
	if f == 0 {
		return d.skip(0)
	}
	if f&traceFields != 0 {
		return d.traceField(r, f)
	}
	if d.seen&f != 0 {
		// Also when either value is null: the key is still given twice.
		d.fail(invalid("duplicate field " + strconv.Quote(string(key))))
		return d.skip(0)
	}
	d.seen |= f
	if d.isNull() {
		// null stands for an absent optional field.
		return nil
	}
	r.fields |= f
	switch f {
	case fieldID:
		start := d.pos
		switch c := d.peek(); {
		case c == '"':
			d.notUnicode = false
			if _, _, err := d.scanString(); err != nil {
				return err
			}
			if d.notUnicode {
				// Not echoed: the reply must be valid UTF-8, and a client
				// would not read back what it sent.
				return nil
			}
		case c == '-' || c >= '0' && c <= '9':
			if _, _, err := d.scanNumber(); err != nil {
				return err
			}
		default:
			d.fail(invalid("id must be a string or a number"))
			return d.skip(0)
		}
		if d.pos-start > limits.MaxIDBytes {
			d.fail(invalid(idRule))
			return nil
		}
		// Echo only a complete token: in {"id":01} the scan stops after
		// "0", which is not what the client sent.
		if d.atMemberEnd() {
			r.ID = append(idBuf[:0], d.data[start:d.pos]...)
		}
		return nil
	case fieldOp:
		s, ok, err := d.bytesValue("op")
		if err != nil || !ok {
			return err
		}
		switch string(s) { // compared in place, not converted
		case "take":
			r.Op = OpTake
		case "peek":
			r.Op = OpPeek
		case "ping":
			r.Op = OpPing
		case "release":
			r.Op = OpRelease
		case "settle":
			r.Op = OpSettle
		default:
			d.fail(invalid("unknown op " + quoteShort(s) + ": one of take, peek, release, settle, ping"))
		}
		return nil
	case fieldSubject:
		s, _, err := d.stringValue("subject")
		r.Subject = s
		return err
	case fieldPolicy:
		s, _, err := d.stringValue("policy")
		r.Policy = s
		return err
	case fieldRequestID:
		s, _, err := d.stringValue("request_id")
		r.RequestID = s
		return err
	case fieldLimit:
		return d.intValue("limit", &r.Limit)
	case fieldWindowMS:
		return d.intValue("window_ms", &r.WindowMS)
	case fieldCost:
		return d.intValue("cost", &r.Cost)
	case fieldTimeoutMS:
		return d.intValue("timeout_ms", &r.TimeoutMS)
	case fieldAlgorithm:
		s, _, err := d.stringValue("algorithm")
		r.Algorithm = s
		return err
	case fieldRate:
		return d.intValue("rate", &r.Rate)
	case fieldPeriodMS:
		return d.intValue("period_ms", &r.PeriodMS)
	case fieldBurst:
		return d.intValue("burst", &r.Burst)
	case fieldLeaseMS:
		return d.intValue("lease_ms", &r.LeaseMS)
	case fieldHeaders:
		return d.boolValue("headers", &r.Headers)
	case fieldPeriod:
		s, _, err := d.stringValue("period")
		r.Period = s
		return err
	case fieldTimeZone:
		s, _, err := d.stringValue("time_zone")
		r.TimeZone = s
		return err
	case fieldWeekStart:
		s, _, err := d.stringValue("week_start")
		r.WeekStart = s
		return err
	case fieldJitterMS:
		return d.intValue("jitter_ms", &r.JitterMS)
	case fieldChecks:
		return d.checks(r)
	}
	return nil
}

func (d *decoder) isNull() bool {
	if len(d.data)-d.pos >= 4 && string(d.data[d.pos:d.pos+4]) == "null" {
		d.pos += 4
		return true
	}
	return false
}

// atMemberEnd reports whether only whitespace separates the scan position
// from the ',' or '}' that must follow an object member's value.
func (d *decoder) atMemberEnd() bool {
	for i := d.pos; i < len(d.data); i++ {
		switch d.data[i] {
		case ' ', '\t', '\r', '\n':
		case ',', '}':
			return true
		default:
			return false
		}
	}
	return false
}

// stringValue decodes a JSON string; ok is false (and a semantic error kept)
// when the value is of another type. err is a syntax error.
func (d *decoder) stringValue(name string) (s string, ok bool, err error) {
	b, ok, err := d.bytesValue(name)
	return string(b), ok, err
}

// bytesValue is stringValue without the copy into a string: without escapes
// it aliases the line.
func (d *decoder) bytesValue(name string) (b []byte, ok bool, err error) {
	if d.peek() != '"' {
		if err := d.skip(0); err != nil {
			return nil, false, err
		}
		d.fail(invalid(name + " must be a string"))
		return nil, false, nil
	}
	raw, escaped, err := d.scanString()
	if err != nil {
		return nil, false, err
	}
	if !escaped {
		return raw, true, nil
	}
	return unescape(raw), true, nil
}

// intValue accepts a JSON integer only: no fraction, no exponent, no string.
// Out-of-range magnitudes are clamped to a value the range checks reject.
// Like stringValue, it keeps a semantic error and returns a syntax error.
func (d *decoder) intValue(name string, dst *int64) error {
	c := d.peek()
	if c != '-' && (c < '0' || c > '9') {
		if err := d.skip(0); err != nil {
			return err
		}
		d.fail(invalid(name + " must be an integer"))
		return nil
	}
	raw, integer, err := d.scanNumber()
	if err != nil {
		return err
	}
	if !integer {
		d.fail(invalid(name + " must be an integer, without fraction or exponent"))
		return nil
	}
	neg := raw[0] == '-'
	if neg {
		raw = raw[1:]
	}
	var n int64
	for _, b := range raw {
		n = n*10 + int64(b-'0')
		if n > 1<<53 {
			n = 1 << 53 // far out of every range; keeps the loop overflow-free
		}
	}
	if neg {
		n = -n
	}
	*dst = n
	return nil
}

// boolValue accepts true or false only.
func (d *decoder) boolValue(name string, dst *bool) error {
	for _, lit := range [...]string{"true", "false"} {
		if len(d.data)-d.pos >= len(lit) && string(d.data[d.pos:d.pos+len(lit)]) == lit {
			d.pos += len(lit)
			*dst = lit == "true"
			return nil
		}
	}
	if err := d.skip(0); err != nil {
		return err
	}
	d.fail(invalid(name + " must be true or false"))
	return nil
}

func (d *decoder) peek() byte {
	if d.pos < len(d.data) {
		return d.data[d.pos]
	}
	return 0
}

func (d *decoder) eat(c byte) bool {
	if d.pos < len(d.data) && d.data[d.pos] == c {
		d.pos++
		return true
	}
	return false
}

func (d *decoder) space() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\r', '\n':
			d.pos++
		default:
			return
		}
	}
}

// scanString consumes a JSON string starting at its opening quote and
// returns its raw contents (between the quotes) and whether it holds escapes.
// A malformed string (raw control character, bad escape, no closing quote)
// is a syntax error. A well-formed string that is not valid Unicode (raw
// bytes that are not UTF-8, or a \u escape of a UTF-16 surrogate that is not
// half of a pair) is a semantic error naming the field: encoding/json would
// turn each into U+FFFD, so distinct subjects would share one window.
func (d *decoder) scanString() (raw []byte, escaped bool, err error) {
	d.pos++ // opening quote
	start := d.pos
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			raw = d.data[start:d.pos]
			d.pos++
			return raw, escaped, nil
		case c == '\\':
			escaped = true
			d.pos++
			if d.pos >= len(d.data) {
				return nil, false, invalid("invalid JSON: unterminated string")
			}
			switch d.data[d.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				d.pos++
			case 'u':
				if d.pos+5 > len(d.data) || !isHex4(d.data[d.pos+1:d.pos+5]) {
					return nil, false, invalid("invalid JSON: bad \\u escape")
				}
				r := rune(hexVal(d.data[d.pos+1 : d.pos+5]))
				d.pos += 5
				if utf16IsSurrogate(r) && !d.eatLowSurrogate(r) {
					d.refuseString("lone UTF-16 surrogate \\u" + strconv.FormatInt(int64(r), 16))
				}
			default:
				return nil, false, invalid("invalid JSON: bad escape in string")
			}
		case c < 0x20:
			return nil, false, invalid("invalid JSON: control character in string")
		case c < utf8.RuneSelf:
			d.pos++
		default:
			r, size := utf8.DecodeRune(d.data[d.pos:])
			if r == utf8.RuneError && size == 1 {
				d.refuseString("invalid UTF-8 byte 0x" + strconv.FormatInt(int64(c), 16))
			}
			d.pos += size
		}
	}
	return nil, false, invalid("invalid JSON: unterminated string")
}

// eatLowSurrogate consumes the \u escape of a low surrogate that pairs with
// r, a surrogate just scanned, and reports whether there was one. A low
// surrogate never opens a pair.
func (d *decoder) eatLowSurrogate(r rune) bool {
	if r >= 0xdc00 || d.pos+6 > len(d.data) || d.data[d.pos] != '\\' || d.data[d.pos+1] != 'u' ||
		!isHex4(d.data[d.pos+2:d.pos+6]) {
		return false
	}
	if r2 := hexVal(d.data[d.pos+2 : d.pos+6]); r2 < 0xdc00 || r2 >= 0xe000 {
		return false
	}
	d.pos += 6
	return true
}

// refuseString keeps the error of a string that is not valid Unicode,
// naming where it is: the field, an unknown field's key, or an object key.
func (d *decoder) refuseString(what string) {
	d.notUnicode = true
	if d.err != nil {
		return // only the first error is reported; spare the message
	}
	where := "object key"
	switch {
	case d.key == nil:
	case fieldOf(d.key) != 0:
		where = string(d.key)
	default:
		where = "field " + quoteShort(d.key)
	}
	d.fail(invalid(where + " must be valid Unicode: " + what))
}

// maxQuotedBytes bounds the client text an error message quotes, so that a
// reply stays a few hundred bytes however long the line.
const maxQuotedBytes = 64

// quoteShort quotes b, cut to its first maxQuotedBytes bytes ("..." after
// the quote says so). strconv.Quote escapes whatever is not valid UTF-8,
// a rune cut in two included.
func quoteShort(b []byte) string {
	if len(b) <= maxQuotedBytes {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:maxQuotedBytes])) + "..."
}

// scanNumber consumes a JSON number and reports whether it is an integer
// (no fraction, no exponent).
func (d *decoder) scanNumber() (raw []byte, integer bool, err error) {
	start := d.pos
	d.eat('-')
	switch c := d.peek(); {
	case c == '0':
		d.pos++
	case c >= '1' && c <= '9':
		d.digits()
	default:
		return nil, false, errBadNumber()
	}
	integer = true
	if d.eat('.') {
		integer = false
		if d.digits() == 0 {
			return nil, false, errBadNumber()
		}
	}
	if c := d.peek(); c == 'e' || c == 'E' {
		integer = false
		d.pos++
		if c := d.peek(); c == '+' || c == '-' {
			d.pos++
		}
		if d.digits() == 0 {
			return nil, false, errBadNumber()
		}
	}
	return d.data[start:d.pos], integer, nil
}

// errBadNumber builds the error only on failure: scanNumber runs for every
// number of every request.
func errBadNumber() error { return invalid("invalid JSON: malformed number") }

func (d *decoder) digits() int {
	n := 0
	for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
		d.pos++
		n++
	}
	return n
}

// skip consumes any JSON value, checking its syntax. depth counts the
// containers already open around the value, below the request object; a
// value may open at most maxNesting more.
func (d *decoder) skip(depth int) error {
	if depth >= maxNesting && (d.peek() == '{' || d.peek() == '[') {
		return invalid("invalid JSON: nesting too deep")
	}
	switch c := d.peek(); {
	case c == '"':
		_, _, err := d.scanString()
		return err
	case c == '-' || c >= '0' && c <= '9':
		_, _, err := d.scanNumber()
		return err
	case c == '{':
		return d.skipContainer(depth, '}', true)
	case c == '[':
		return d.skipContainer(depth, ']', false)
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(d.data)-d.pos >= len(lit) && string(d.data[d.pos:d.pos+len(lit)]) == lit {
				d.pos += len(lit)
				return nil
			}
		}
		return invalid("invalid JSON: unexpected character")
	}
}

func (d *decoder) skipContainer(depth int, closer byte, object bool) error {
	d.pos++
	d.space()
	if d.eat(closer) {
		return nil
	}
	for {
		d.space()
		if object {
			if d.peek() != '"' {
				return invalid("invalid JSON: expected a string as object key")
			}
			if _, _, err := d.scanString(); err != nil {
				return err
			}
			d.space()
			if !d.eat(':') {
				return invalid("invalid JSON: expected ':' after object key")
			}
			d.space()
		}
		if err := d.skip(depth + 1); err != nil {
			return err
		}
		d.space()
		if d.eat(',') {
			continue
		}
		if d.eat(closer) {
			return nil
		}
		return invalid("invalid JSON: expected ',' or a closing bracket")
	}
}

func isHex4(b []byte) bool {
	for _, c := range b[:4] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// unescape decodes the contents of a JSON string already checked by
// scanString. A lone surrogate becomes U+FFFD, as in encoding/json; only
// a request that scanString already failed can hold one.
func unescape(raw []byte) []byte {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		i++
		switch raw[i] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := rune(hexVal(raw[i+1 : i+5]))
			i += 4
			if utf16IsSurrogate(r) {
				r2 := rune(-1)
				if i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					r2 = rune(hexVal(raw[i+3 : i+7]))
				}
				if dec := utf16Decode(r, r2); dec != utf8.RuneError {
					r = dec
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
		default: // '"', '\\', '/'
			out = append(out, raw[i])
		}
		i++
	}
	return out
}

func hexVal(b []byte) int {
	n := 0
	for _, c := range b[:4] {
		n <<= 4
		switch {
		case c >= '0' && c <= '9':
			n |= int(c - '0')
		case c >= 'a' && c <= 'f':
			n |= int(c-'a') + 10
		default:
			n |= int(c-'A') + 10
		}
	}
	return n
}

func utf16IsSurrogate(r rune) bool { return r >= 0xd800 && r < 0xe000 }

func utf16Decode(r1, r2 rune) rune {
	if r1 >= 0xd800 && r1 < 0xdc00 && r2 >= 0xdc00 && r2 < 0xe000 {
		return (r1-0xd800)<<10 | (r2 - 0xdc00) + 0x10000
	}
	return utf8.RuneError
}
