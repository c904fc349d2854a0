package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"quotad/limits"
	"quotad/protocol"
)

// knownKeys are the request fields Decode reads.
var knownKeys = []string{"id", "op", "subject", "policy", "limit", "window_ms", "cost", "request_id", "timeout_ms",
	"algorithm", "rate", "period_ms", "burst", "lease_ms", "headers", "traceparent", "tracestate"}

// plainKeys reports whether encoding/json reads the same fields from line
// as Decode should: every top-level key appears once, and none is a
// case-variant of a known field (encoding/json would match "OP" or
// "\u017fubject" to a field; Decode ignores them).
func plainKeys(line []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		key := tok.(string)
		if seen[key] {
			return false
		}
		seen[key] = true
		for _, k := range knownKeys {
			if key != k && (strings.EqualFold(key, k) || strings.EqualFold(strip(key), strip(k))) {
				return false
			}
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false
		}
	}
	return true
}

// strip drops '_' and '-', which looser JSON name matching ignores.
func strip(s string) string {
	return strings.NewReplacer("_", "", "-", "").Replace(s)
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"op":"ping"}`,
		`{"id":7,"op":"take","subject":"user:42","limit":5,"window_ms":60000,"cost":2,"request_id":"order-1","timeout_ms":250}`,
		`{"id":"x","op":"peek","subject":"s","policy":"api"}`,
		`{"op":"settle","subject":"s","policy":"api","request_id":"r-1","cost":0}`,
		`{"op":"take","subject":"\ud83d\ude00\ud800","policy":"p","x":{"a":[1,2.5e-3,null,true]}}`,
		`{"op":"take","subject":"\ud83d\ude00\ufffd","policy":"p","x":{"\ud83d\ude00":["\uDBFF\uDFFF"]}}`,
		`{"op":"take","subject":"sur\udbff","policy":"p"}`,
		`{"op":"take","subject":"\udc00","policy":"p"}`,
		`{"op":"take","subject":"a\ud800\u0041","policy":"p"}`,
		`{"id":"\ud800","op":"ping","x":"\udfff","\ud800":1}`,
		`{"op":"take","subject":"s","algorithm":"concurrency\ud800","limit":1,"lease_ms":1,"request_id":"r\udc00"}`,
		`{"op":"take","subject":"s","limit":1e0,"window_ms":1}`,
		`{"op":null,"op":"ping"}`,
		`{"OP":"ping"}`,
		`{"\u006fp":"ping"}`,
		`{"op":"launch","id":"x"}`,
		`{"id":01}`,
		"{\"op\":\"take\",\"subject\":\"\xff\",\"policy\":\"p\"}",
		`{"op":"ping"} x`,
		`{"op":"take","cost":2,"request_id":"r","checks":[{"policy":"p","subject":"a"},{"subject":"b","limit":3,"window_ms":9,"cost":1}]}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`,
		``,
		`{"op":"take","subject":"s","policy":"p","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"a=b,c@d=e"}`,
		`{"op":"take","subject":"s","policy":"p","traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}`,
		`{"op":"take","subject":"s","policy":"p","traceparent":[1,{"a":"\ud800"}],"tracestate":7}`,
		`{"op":"take","checks":[{"policy":"p","subject":"a","traceparent":"x","tracestate":"y"}],"traceparent":"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var r protocol.Request
		err := protocol.Decode(line, &r)

		// Whatever Decode did, the reply for it is one valid line and
		// echoes the id byte for byte.
		var reply []byte
		if err != nil {
			reply = protocol.AppendErr(nil, r.ID, err)
		} else {
			reply = protocol.AppendTake(nil, r.ID, protocol.TakeReply{})
		}
		if !json.Valid(reply) || !utf8.Valid(reply) || bytes.IndexByte(reply, '\n') != len(reply)-1 {
			t.Fatalf("reply %q is not one valid JSON line", reply)
		}
		if r.ID != nil {
			if len(r.ID) == 0 || len(r.ID) > limits.MaxIDBytes || !json.Valid(r.ID) || !bytes.Contains(line, r.ID) {
				t.Fatalf("ID %q is not a token of at most 128 bytes from the line", r.ID)
			}
			dec := json.NewDecoder(bytes.NewReader(r.ID))
			dec.UseNumber() // 1e400 is a valid id, beyond float64
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("ID %q: %v", r.ID, err)
			}
			switch v.(type) {
			case string, json.Number:
			default:
				t.Fatalf("ID %q is neither a string nor a number", r.ID)
			}
		}

		if err != nil {
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Code != protocol.CodeInvalid || !errors.Is(err, protocol.ErrInvalid) {
				t.Fatalf("Decode(%q) = %#v, want an INVALID *protocol.Error", line, err)
			}
			return
		}
		checkTraceNeverFails(t, line, &r)

		if !json.Valid(line) {
			t.Fatalf("Decode accepted %q, which encoding/json rejects", line)
		}
		// Every string of an accepted line is valid Unicode, wherever it is:
		// no lone surrogate, no byte that is not UTF-8.
		for _, raw := range stringTokens(line) {
			if _, ok := strictString(raw); !ok {
				t.Fatalf("Decode accepted %q, whose string %q is not valid Unicode", line, raw)
			}
		}
		switch r.Op {
		case protocol.OpPing:
		case protocol.OpTake, protocol.OpPeek, protocol.OpRelease, protocol.OpSettle:
			if len(r.Checks) == 0 {
				checkAddressing(t, line, &r)
			}
		default:
			t.Fatalf("Decode accepted %q with op %v", line, r.Op)
		}
		if len(r.Checks) > limits.MaxChecks || len(r.Checks) > 0 && (r.Op != protocol.OpTake || r.Subject != "") {
			t.Fatalf("Decode(%q) accepted %d checks of a %v with subject %q", line, len(r.Checks), r.Op, r.Subject)
		}
		for i := range r.Checks {
			checkAddressing(t, line, &r.Checks[i])
			checkSubjectIsItsOwn(t, line, r.Checks[i].Subject)
		}
		if r.Op != protocol.OpPing && len(r.Checks) == 0 {
			checkSubjectIsItsOwn(t, line, r.Subject)
		}
		if !plainKeys(line) {
			return
		}
		// Each string field is what a strict decoder makes of it, code point
		// for code point: encoding/json, below, maps every lone surrogate to
		// U+FFFD, so agreeing with it alone would let two subjects collide.
		for name, got := range map[string]string{"op": r.Op.String(), "subject": r.Subject, "policy": r.Policy,
			"request_id": r.RequestID, "algorithm": r.Algorithm} {
			raw, ok := topLevelString(line, name)
			if !ok {
				continue
			}
			if want, _ := strictString(raw); want != got {
				t.Fatalf("Decode(%q): %s = %q, the strict decoding of %q is %q", line, name, got, raw, want)
			}
		}
		var std struct {
			ID        json.RawMessage `json:"id"`
			Op        string          `json:"op"`
			Subject   string          `json:"subject"`
			Policy    string          `json:"policy"`
			RequestID string          `json:"request_id"`
			Headers   bool            `json:"headers"`
		}
		if err := json.Unmarshal(line, &std); err != nil {
			t.Fatalf("Decode accepted %q; encoding/json: %v", line, err)
		}
		if string(std.ID) == "null" {
			std.ID = nil
		}
		if string(std.ID) != string(r.ID) || std.Op != r.Op.String() || std.Subject != r.Subject ||
			std.Policy != r.Policy || std.RequestID != r.RequestID || std.Headers != r.Headers {
			t.Fatalf("Decode(%q) = id %s op %q subject %q policy %q request_id %q\nencoding/json: id %s op %q subject %q policy %q request_id %q",
				line, r.ID, r.Op, r.Subject, r.Policy, r.RequestID, std.ID, std.Op, std.Subject, std.Policy, std.RequestID)
		}
		if r.Op == protocol.OpPing {
			return // numbers of a ping are not range-checked
		}
		var nums struct {
			Limit     int64  `json:"limit"`
			WindowMS  int64  `json:"window_ms"`
			Cost      *int64 `json:"cost"`
			TimeoutMS int64  `json:"timeout_ms"`
		}
		if err := json.Unmarshal(line, &nums); err != nil {
			t.Fatalf("Decode accepted %q; encoding/json: %v", line, err)
		}
		cost := int64(1)
		if nums.Cost != nil {
			cost = *nums.Cost
		}
		if nums.Limit != r.Limit || nums.WindowMS != r.WindowMS || cost != r.Cost || nums.TimeoutMS != r.TimeoutMS {
			t.Fatalf("Decode(%q) numbers %d %d %d %d, encoding/json %d %d %d %d", line,
				r.Limit, r.WindowMS, r.Cost, r.TimeoutMS, nums.Limit, nums.WindowMS, cost, nums.TimeoutMS)
		}
	})
}

// checkTraceNeverFails asserts that a trace context is never an error and
// changes nothing else: the accepted line with the line itself, as a
// string, for its traceparent and tracestate, decodes to the same request,
// and a valid traceparent decoded is one.
func checkTraceNeverFails(t *testing.T, line []byte, r *protocol.Request) {
	t.Helper()
	if r.Trace.Valid() && (r.Trace.ParentID == [8]byte{} || !bytes.Contains(line, []byte("traceparent"))) {
		t.Fatalf("Decode(%q) kept trace context %+v", line, r.Trace)
	}
	if !r.Trace.Valid() && r.Trace.State != "" {
		t.Fatalf("Decode(%q) kept tracestate %q without a traceparent", line, r.Trace.State)
	}
	if len(line) == 0 || line[0] != '{' {
		return
	}
	s, _ := json.Marshal(string(line))
	for _, key := range []string{"traceparent", "tracestate"} {
		with := append([]byte(`{"`+key+`":`+string(s)+`,`), line[1:]...)
		if bytes.Equal(bytes.TrimSpace(line[1:]), []byte("}")) {
			with = append([]byte(`{"`+key+`":`+string(s)), line[1:]...)
		}
		var r2 protocol.Request
		if err := protocol.Decode(with, &r2); err != nil {
			t.Fatalf("Decode(%q) failed (%v) where without its %s it did not", with, err, key)
		}
		if r2.Op != r.Op || r2.Subject != r.Subject || r2.Policy != r.Policy || r2.Cost != r.Cost || len(r2.Checks) != len(r.Checks) {
			t.Fatalf("Decode(%q) = %+v, another request than without its %s", with, r2, key)
		}
	}
}

// checkSubjectIsItsOwn asserts that an accepted subject round-trips and
// that no other raw subject decodes to it: the subject re-encoded by
// encoding/json decodes back to the same bytes, the same subject with a
// lone surrogate after it is refused, and with U+FFFD after it (the
// character encoding/json would put in the surrogate's place) decodes to
// the subject and that character.
func checkSubjectIsItsOwn(t *testing.T, line []byte, subject string) {
	t.Helper()
	enc, err := json.Marshal(subject)
	if err != nil {
		t.Fatalf("Decode(%q): subject %q does not encode: %v", line, subject, err)
	}
	body := enc[1 : len(enc)-1]
	decodeSubject := func(raw []byte) (string, error) {
		var r protocol.Request
		l := append(append([]byte(`{"op":"peek","policy":"p","subject":"`), raw...), `"}`...)
		err := protocol.Decode(l, &r)
		return r.Subject, err
	}
	if got, err := decodeSubject(body); err != nil || got != subject {
		t.Fatalf("Decode(%q): subject %q re-encoded as %s decodes to %q, %v", line, subject, enc, got, err)
	}
	for _, lone := range []string{`\ud800`, `\udc00`, `\udbff\u0041`} {
		if got, err := decodeSubject(append(bytes.Clone(body), lone...)); !errors.Is(err, protocol.ErrInvalid) {
			t.Fatalf("Decode(%q): subject %q followed by %s decodes to %q, %v; want INVALID", line, subject, lone, got, err)
		}
	}
	if len(subject)+3 <= limits.MaxSubjectBytes {
		if got, err := decodeSubject(append(bytes.Clone(body), `\ufffd`...)); err != nil || got != subject+"\ufffd" {
			t.Fatalf("Decode(%q): subject %q followed by \\ufffd decodes to %q, %v", line, subject, got, err)
		}
	}
}

// stringTokens returns the raw contents of every string in line, a valid
// JSON text: keys and values, at any depth.
func stringTokens(line []byte) [][]byte {
	var out [][]byte
	for i := 0; i < len(line); i++ {
		if line[i] != '"' {
			continue
		}
		start := i + 1
		for i = start; line[i] != '"'; i++ {
			if line[i] == '\\' {
				i++
			}
		}
		out = append(out, line[start:i])
	}
	return out
}

// topLevelString returns the raw contents of the top-level member name of
// line when its value is a string. line is a valid JSON object whose keys
// are plain (plainKeys).
func topLevelString(line []byte, name string) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(line))
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		if key == name && len(raw) > 0 && raw[0] == '"' {
			return raw[1 : len(raw)-1], true
		}
	}
	return nil, false
}

// strictString decodes the raw contents of a JSON string as RFC 8259 and
// RFC 3629 read together: escapes are UTF-16 code units and must pair up
// into code points, raw bytes must be UTF-8. ok is false when the string is
// not valid Unicode. It is written apart from Decode's scanner, from
// unicode/utf16, so that the two can be compared.
func strictString(raw []byte) (s string, ok bool) {
	var units []uint16
	for i := 0; i < len(raw); {
		if raw[i] != '\\' {
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				return "", false
			}
			units = utf16.AppendRune(units, r)
			i += size
			continue
		}
		switch e := raw[i+1]; e {
		case 'u':
			n, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
			if err != nil {
				return "", false
			}
			units = append(units, uint16(n))
			i += 6
			continue
		case 'b':
			units = append(units, '\b')
		case 'f':
			units = append(units, '\f')
		case 'n':
			units = append(units, '\n')
		case 'r':
			units = append(units, '\r')
		case 't':
			units = append(units, '\t')
		default: // '"', '\\', '/'
			units = append(units, uint16(e))
		}
		i += 2
	}
	isHigh := func(u uint16) bool { return u >= 0xd800 && u < 0xdc00 }
	isLow := func(u uint16) bool { return u >= 0xdc00 && u < 0xe000 }
	for i := 0; i < len(units); i++ {
		switch {
		case isHigh(units[i]) && i+1 < len(units) && isLow(units[i+1]):
			i++
		case isHigh(units[i]) || isLow(units[i]):
			return "", false
		}
	}
	return string(utf16.Decode(units)), true
}

// checkAddressing asserts the field rules of an accepted take or peek.
func checkAddressing(t *testing.T, line []byte, r *protocol.Request) {
	t.Helper()
	if r.Subject == "" || len(r.Subject) > limits.MaxSubjectBytes || !utf8.ValidString(r.Subject) ||
		strings.IndexFunc(r.Subject, unicode.IsControl) >= 0 {
		t.Fatalf("Decode(%q) accepted subject %q", line, r.Subject)
	}
	if (r.Policy != "") == r.HasInline() {
		t.Fatalf("Decode(%q) accepted policy %q with inline %v", line, r.Policy, r.HasInline())
	}
	if r.Policy != "" && !limits.ValidPolicyName(r.Policy) {
		t.Fatalf("Decode(%q) accepted policy %q", line, r.Policy)
	}
	if r.HasInline() {
		checkInline(t, line, r)
	}
	if r.Op == protocol.OpRelease && r.RequestID == "" {
		t.Fatalf("Decode(%q) accepted a release without request_id", line)
	}
	if r.Op == protocol.OpSettle && r.RequestID == "" {
		t.Fatalf("Decode(%q) accepted a settle without request_id", line)
	}
	least := int64(1)
	if r.Op == protocol.OpSettle {
		least = 0 // a refund
	}
	if r.Cost < least || r.Cost > limits.MaxLimit || r.TimeoutMS < 0 || r.TimeoutMS > limits.MaxTimeoutMS {
		t.Fatalf("Decode(%q) accepted cost %d timeout_ms %d", line, r.Cost, r.TimeoutMS)
	}
	for _, c := range []byte(r.RequestID) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			t.Fatalf("Decode(%q) accepted request_id %q", line, r.RequestID)
		}
	}
	if len(r.RequestID) > limits.MaxRequestIDBytes {
		t.Fatalf("Decode(%q) accepted request_id %q", line, r.RequestID)
	}
}

// checkInline: the inline limits Decode accepted are those of one algorithm,
// in range.
func checkInline(t *testing.T, line []byte, r *protocol.Request) {
	t.Helper()
	switch r.InlineAlgorithm() {
	case protocol.AlgorithmFixedWindow:
		if r.Limit < 1 || r.Limit > limits.MaxLimit || r.WindowMS < 1 || r.WindowMS > limits.MaxWindowMS {
			t.Fatalf("Decode(%q) accepted limit %d window_ms %d", line, r.Limit, r.WindowMS)
		}
	case protocol.AlgorithmTokenBucket:
		if protocol.ValidTokenBucket(r.Rate, r.PeriodMS, r.Burst) != nil || r.Limit != 0 || r.WindowMS != 0 || r.LeaseMS != 0 {
			t.Fatalf("Decode(%q) accepted a token bucket %+v", line, r)
		}
	case protocol.AlgorithmConcurrency:
		if r.Limit < 1 || r.Limit > limits.MaxLeases || r.LeaseMS < 1 || r.LeaseMS > limits.MaxWindowMS || r.WindowMS != 0 || r.Rate != 0 {
			t.Fatalf("Decode(%q) accepted a concurrency limit %+v", line, r)
		}
	default:
		t.Fatalf("Decode(%q) accepted algorithm %q", line, r.Algorithm)
	}
}

// expectLines is the model of LineReader: input split at '\n', one trailing
// '\r' trimmed from each line, no line after a final '\n', and lines longer
// than max replaced by ErrTooLarge.
func expectLines(input []byte, max int) []string {
	if len(input) == 0 {
		return nil
	}
	pieces := bytes.Split(input, []byte("\n"))
	if len(pieces[len(pieces)-1]) == 0 {
		pieces = pieces[:len(pieces)-1]
	}
	want := make([]string, 0, len(pieces))
	for _, p := range pieces {
		p = bytes.TrimSuffix(p, []byte("\r"))
		if len(p) > max {
			want = append(want, tooLarge)
		} else {
			want = append(want, string(p))
		}
	}
	return want
}

func FuzzLineReader(f *testing.F) {
	f.Add([]byte("a\nb\r\n\n"), 16, 4, uint64(0))
	f.Add([]byte("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\nok\n"), 16, 20, uint64(1))
	f.Add([]byte("xxxxxxxxxxxxxxxxxxxx\r\nxxxxxxxxxxxxxxxxxxxxx\r\n"), 16, 20, uint64(2))
	f.Add([]byte("\r\r\n\r"), 1, 0, uint64(3))
	f.Add([]byte("last line without newline"), 64, 100, uint64(4))
	f.Add([]byte("oversized last line without newline"), 16, 8, uint64(5))
	f.Fuzz(func(t *testing.T, input []byte, bufSize, max int, seed uint64) {
		bufSize = 1 + int(uint(bufSize)%512)
		max = int(uint(max) % 1024)
		cr := chunkReader{data: bytes.Clone(input), rnd: rand.New(rand.NewPCG(seed, seed>>32)), max: 1 + int(seed%97)}
		var r io.Reader = &cr
		if seed&1 == 1 {
			// A non-blocking source, as the sidecar's sockets are.
			r = &wouldBlockReader{chunkReader: cr}
		}
		lr := protocol.NewLineReader(r, bufSize, max)
		want := expectLines(input, max)
		var got []string
		for {
			line, err := lr.ReadLine()
			if err == io.EOF {
				break
			}
			if errors.Is(err, protocol.ErrWouldBlock) {
				if line != nil {
					t.Fatalf("ReadLine returned %q with ErrWouldBlock", line)
				}
				continue // the source has more later
			}
			if errors.Is(err, protocol.ErrTooLarge) {
				got = append(got, tooLarge)
			} else if err != nil {
				t.Fatalf("ReadLine: %v", err)
			} else {
				if len(line) > max {
					t.Fatalf("ReadLine returned %d bytes, max %d", len(line), max)
				}
				got = append(got, string(line))
			}
			if len(got) > len(want) {
				t.Fatalf("more lines than the input holds: got %q, want %q", got, want)
			}
		}
		if !equalLines(got, want) {
			t.Fatalf("input %q, bufSize %d, max %d:\n got %q\nwant %q", input, bufSize, max, got, want)
		}
	})
}
