package protocol_test

import (
	"errors"
	"strings"
	"testing"

	"quotad/protocol"
)

// want is the exported view of a decoded request; ID is the raw JSON text,
// "" when absent.
type want struct {
	ID        string
	Op        protocol.Op
	Subject   string
	Policy    string
	Limit     int64
	WindowMS  int64
	Cost      int64
	RequestID string
	TimeoutMS int64
	Inline    bool
	Headers   bool
}

func view(r *protocol.Request) want {
	return want{
		ID:        string(r.ID),
		Op:        r.Op,
		Subject:   r.Subject,
		Policy:    r.Policy,
		Limit:     r.Limit,
		WindowMS:  r.WindowMS,
		Cost:      r.Cost,
		RequestID: r.RequestID,
		TimeoutMS: r.TimeoutMS,
		Inline:    r.HasInline(),
		Headers:   r.Headers,
	}
}

func TestDecodeValid(t *testing.T) {
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	tests := []struct {
		name string
		line string
		want want
	}{
		{
			name: "take by policy",
			line: `{"op":"take","subject":"user:42","policy":"api"}`,
			want: want{Op: protocol.OpTake, Subject: "user:42", Policy: "api", Cost: 1},
		},
		{
			name: "take inline with every field",
			line: `{"id":7,"op":"take","subject":"user:42","limit":5,"window_ms":60000,"cost":2,"request_id":"order-1","timeout_ms":250}`,
			want: want{ID: `7`, Op: protocol.OpTake, Subject: "user:42", Limit: 5, WindowMS: 60000,
				Cost: 2, RequestID: "order-1", TimeoutMS: 250, Inline: true},
		},
		{
			name: "peek by policy",
			line: `{"op":"peek","subject":"s","policy":"a.b-c_D9"}`,
			want: want{Op: protocol.OpPeek, Subject: "s", Policy: "a.b-c_D9", Cost: 1},
		},
		{
			name: "peek inline",
			line: `{"op":"peek","subject":"s","limit":1,"window_ms":1}`,
			want: want{Op: protocol.OpPeek, Subject: "s", Limit: 1, WindowMS: 1, Cost: 1, Inline: true},
		},
		{
			name: "take asking for the header fields",
			line: `{"op":"take","subject":"s","policy":"api","headers":true}`,
			want: want{Op: protocol.OpTake, Subject: "s", Policy: "api", Cost: 1, Headers: true},
		},
		{
			name: "peek with headers false or null: none",
			line: `{"op":"peek","subject":"s","policy":"api","headers":false}`,
			want: want{Op: protocol.OpPeek, Subject: "s", Policy: "api", Cost: 1},
		},
		{
			name: "headers null is absent",
			line: `{"op":"take","subject":"s","policy":"api","headers":null}`,
			want: want{Op: protocol.OpTake, Subject: "s", Policy: "api", Cost: 1},
		},
		{
			name: "ping",
			line: `{"op":"ping"}`,
			want: want{Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "ping with string id echoed with quotes and escapes",
			line: `{"op":"ping","id":"a\"b\u00e9"}`,
			want: want{ID: `"a\"b\u00e9"`, Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "number id kept as written",
			line: `{"id":-1.50e+3,"op":"ping"}`,
			want: want{ID: `-1.50e+3`, Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "id followed by whitespace",
			line: "{\"id\" : 12 \t, \"op\":\"ping\",\"id2\":\"x\"}",
			want: want{ID: `12`, Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "id last",
			line: `{"op":"ping","id":"x"   }`,
			want: want{ID: `"x"`, Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "upper bounds",
			line: `{"op":"take","subject":"` + long("s", 256) + `","limit":1000000000,"window_ms":2678400000,"cost":1000000000,"request_id":"` + long("r", 64) + `","timeout_ms":3600000}`,
			want: want{Op: protocol.OpTake, Subject: long("s", 256), Limit: 1e9, WindowMS: 2678400000,
				Cost: 1e9, RequestID: long("r", 64), TimeoutMS: 3600000, Inline: true},
		},
		{
			name: "lower bounds",
			line: `{"op":"take","subject":"s","limit":1,"window_ms":1,"cost":1,"request_id":"r","timeout_ms":1}`,
			want: want{Op: protocol.OpTake, Subject: "s", Limit: 1, WindowMS: 1, Cost: 1, RequestID: "r", TimeoutMS: 1, Inline: true},
		},
		{
			name: "policy of 64 bytes",
			line: `{"op":"take","subject":"s","policy":"` + long("p", 64) + `"}`,
			want: want{Op: protocol.OpTake, Subject: "s", Policy: long("p", 64), Cost: 1},
		},
		{
			name: "subject of 256 bytes in multi-byte characters",
			line: `{"op":"take","subject":"` + long("é", 128) + `","policy":"p"}`,
			want: want{Op: protocol.OpTake, Subject: long("é", 128), Policy: "p", Cost: 1},
		},
		{
			name: "id of 128 bytes including quotes",
			line: `{"id":"` + long("i", 126) + `","op":"ping"}`,
			want: want{ID: `"` + long("i", 126) + `"`, Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "null means absent",
			line: `{"id":null,"op":"take","subject":"s","policy":null,"limit":3,"window_ms":10,"cost":null,"request_id":null,"timeout_ms":null}`,
			want: want{Op: protocol.OpTake, Subject: "s", Limit: 3, WindowMS: 10, Cost: 1, Inline: true},
		},
		{
			name: "null policy beside inline limits",
			line: `{"op":"take","subject":"s","policy":null,"limit":3,"window_ms":10}`,
			want: want{Op: protocol.OpTake, Subject: "s", Limit: 3, WindowMS: 10, Cost: 1, Inline: true},
		},
		{
			name: "null limits beside policy",
			line: `{"op":"take","subject":"s","policy":"p","limit":null,"window_ms":null}`,
			want: want{Op: protocol.OpTake, Subject: "s", Policy: "p", Cost: 1},
		},
		{
			name: "unknown fields of every type ignored",
			line: `{"x":{"a":[1,-2.5e-3,{"b":null}],"c":true,"d":false,"e":"\u0001\n"},"y":[],"z":{},"op":"ping","w":"é"}`,
			want: want{Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "unknown field nested 32 deep",
			line: `{"x":` + long("[", 32) + long("]", 32) + `,"op":"ping"}`,
			want: want{Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "duplicate unknown fields allowed",
			line: `{"x":1,"x":2,"op":"ping"}`,
			want: want{Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "whitespace everywhere",
			line: " \t{ \"op\" :\r\n\"take\" , \"subject\" : \"s\" ,\"policy\":\"p\" } \t\r\n",
			want: want{Op: protocol.OpTake, Subject: "s", Policy: "p", Cost: 1},
		},
		{
			name: "escapes in subject",
			line: `{"op":"take","subject":"a\/b\\c\"d\u00e9\u20AC","policy":"p"}`,
			want: want{Op: protocol.OpTake, Subject: `a/b\c"dé€`, Policy: "p", Cost: 1},
		},
		{
			name: "surrogate pair",
			line: `{"op":"take","subject":"\ud83d\ude00","policy":"p"}`,
			want: want{Op: protocol.OpTake, Subject: "😀", Policy: "p", Cost: 1},
		},
		{
			name: "surrogate pair in upper-case hex",
			line: `{"op":"take","subject":"\uD83D\uDE00","policy":"p"}`,
			want: want{Op: protocol.OpTake, Subject: "😀", Policy: "p", Cost: 1},
		},
		{
			name: "surrogate pairs back to back and between text",
			line: `{"op":"take","subject":"a\ud83d\ude00\udbff\udfffb","policy":"p"}`,
			want: want{Op: protocol.OpTake, Subject: "a😀\U0010ffffb", Policy: "p", Cost: 1},
		},
		{
			name: "escaped U+FFFD is the character itself",
			line: `{"op":"take","subject":"\ufffd\uffff\ud7ff\ue000","policy":"p"}`,
			want: want{Op: protocol.OpTake, Subject: "\ufffd\uffff\ud7ff\ue000", Policy: "p", Cost: 1},
		},
		{
			name: "surrogate pair in an unknown field and an unknown key",
			line: `{"x\ud83d\ude00":["\ud83d\ude00",{"\ud83d\ude00":1}],"op":"ping"}`,
			want: want{Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "escaped key matches like encoding/json",
			line: `{"\u006fp":"ping"}`,
			want: want{Op: protocol.OpPing, Cost: 1},
		},
		{
			name: "case-variant key is an unknown field",
			line: `{"op":"take","subject":"s","policy":"p","Subject":5,"POLICY":"x"}`,
			want: want{Op: protocol.OpTake, Subject: "s", Policy: "p", Cost: 1},
		},
		{
			name: "ping ignores addressing",
			line: `{"op":"ping","subject":"s","policy":"p","limit":1,"window_ms":1}`,
			want: want{Op: protocol.OpPing, Subject: "s", Policy: "p", Limit: 1, WindowMS: 1, Cost: 1, Inline: true},
		},
		{
			name: "peek ignores the values of cost and request_id",
			line: `{"op":"peek","subject":"s","policy":"p","cost":0,"request_id":"not valid!"}`,
			want: want{Op: protocol.OpPeek, Subject: "s", Policy: "p", Cost: 0, RequestID: "not valid!"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r protocol.Request
			if err := protocol.Decode([]byte(tt.line), &r); err != nil {
				t.Fatalf("Decode(%s) = %v, want success", tt.line, err)
			}
			if got := view(&r); got != tt.want {
				t.Errorf("Decode(%s)\n got %+v\nwant %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestDecodeInvalid(t *testing.T) {
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	// take builds a take by policy with extra fields spliced in.
	take := func(extra string) string {
		return `{"id":"t","op":"take","subject":"s","policy":"p"` + extra + `}`
	}
	// inline builds a take with inline limits, limit and window_ms last so
	// that a case can replace either.
	inline := func(limit, window string) string {
		return `{"id":"t","op":"take","subject":"s","limit":` + limit + `,"window_ms":` + window + `}`
	}
	tests := []struct {
		name   string
		line   string
		wantID string // the id the error reply echoes; "" for none
	}{
		// Not an object, or not JSON at all.
		{"empty line", ``, ""},
		{"only spaces", `   `, ""},
		{"empty object", `{}`, ""},
		{"array", `[{"op":"ping"}]`, ""},
		{"string", `"ping"`, ""},
		{"null", `null`, ""},
		{"number", `1`, ""},
		{"unterminated object", `{"op":"ping"`, ""},
		{"unterminated after comma", `{"op":"ping",`, ""},
		{"key without value", `{"op"}`, ""},
		// The header fields are asked with a boolean, on a take or peek.
		{"headers a string", take(`,"headers":"true"`), `"t"`},
		{"headers a number", take(`,"headers":1`), `"t"`},
		{"headers twice", take(`,"headers":true,"headers":true`), `"t"`},
		{"headers on a release", `{"id":"t","op":"release","subject":"s","policy":"p","request_id":"r","headers":true}`, `"t"`},
		{"headers not a literal", take(`,"headers":tru`), `"t"`},
		{"missing value", `{"op":}`, ""},
		{"unquoted key", `{op:"ping"}`, ""},
		{"single quotes", `{'op':'ping'}`, ""},
		{"trailing comma", `{"op":"ping",}`, ""},
		{"missing comma", `{"op":"ping" "id":1}`, ""},
		{"unterminated string", `{"op":"ping`, ""},
		{"byte order mark", "\ufeff{\"op\":\"ping\"}", ""},

		// Trailing data.
		{"trailing garbage", `{"id":1,"op":"ping"}x`, "1"},
		{"second object", `{"id":1,"op":"ping"}{}`, "1"},
		{"trailing comma after object", `{"id":1,"op":"ping"} ,`, "1"},
		{"trailing NUL", "{\"id\":1,\"op\":\"ping\"}\x00", "1"},

		// op.
		{"op missing", `{"id":1,"subject":"s","policy":"p"}`, "1"},
		{"op null", `{"id":1,"op":null}`, "1"},
		{"op unknown", `{"id":1,"op":"drop"}`, "1"},
		{"op upper case", `{"id":1,"op":"PING"}`, "1"},
		{"op empty", `{"id":1,"op":""}`, "1"},
		{"op number", `{"id":1,"op":3}`, "1"},
		{"op key upper case", `{"id":1,"OP":"ping"}`, "1"},
		{"op key case variant", `{"id":1,"Op":"ping"}`, "1"},

		// Duplicate known fields.
		{"duplicate op", `{"id":1,"op":"ping","op":"ping"}`, "1"},
		{"duplicate id", `{"id":1,"id":2,"op":"ping"}`, "1"},
		{"duplicate subject", take(`,"subject":"s"`), `"t"`},
		{"duplicate after null", `{"id":1,"op":null,"op":"ping"}`, "1"},
		{"duplicate null after value", `{"id":1,"op":"ping","op":null}`, "1"},
		{"duplicate null id", `{"id":null,"id":null,"op":"ping"}`, ""},
		{"duplicate via escaped key", `{"id":1,"op":"ping","\u006fp":"ping"}`, "1"},

		// id.
		{"id true", `{"id":true,"op":"ping"}`, ""},
		{"id object", `{"id":{},"op":"ping"}`, ""},
		{"id array", `{"id":[1],"op":"ping"}`, ""},
		{"id of 129 bytes", `{"id":"` + long("i", 127) + `","op":"ping"}`, ""},
		{"id with a raw control character", "{\"id\":\"a\x01\",\"op\":\"ping\"}", ""},
		{"id malformed number", `{"id":01,"op":"ping"}`, ""},

		// subject.
		{"subject missing", `{"id":"t","op":"take","policy":"p"}`, `"t"`},
		{"subject null", `{"id":"t","op":"take","subject":null,"policy":"p"}`, `"t"`},
		{"subject empty", `{"id":"t","op":"take","subject":"","policy":"p"}`, `"t"`},
		{"subject of 257 bytes", `{"id":"t","op":"take","subject":"` + long("s", 257) + `","policy":"p"}`, `"t"`},
		{"subject of 257 bytes with a multi-byte character", `{"id":"t","op":"take","subject":"` + long("s", 255) + `é","policy":"p"}`, `"t"`},
		{"subject number", `{"id":"t","op":"take","subject":5,"policy":"p"}`, `"t"`},
		{"subject raw control character", "{\"id\":\"t\",\"op\":\"take\",\"subject\":\"a\x01b\",\"policy\":\"p\"}", `"t"`},
		{"subject raw tab", "{\"id\":\"t\",\"op\":\"take\",\"subject\":\"a\tb\",\"policy\":\"p\"}", `"t"`},
		{"subject escaped control character", `{"id":"t","op":"take","subject":"a\u0001b","policy":"p"}`, `"t"`},
		{"subject escaped NUL", `{"id":"t","op":"take","subject":"\u0000","policy":"p"}`, `"t"`},
		{"subject escaped newline", `{"id":"t","op":"take","subject":"a\nb","policy":"p"}`, `"t"`},
		{"subject raw DEL", "{\"id\":\"t\",\"op\":\"take\",\"subject\":\"a\x7fb\",\"policy\":\"p\"}", `"t"`},
		{"subject escaped C1 control", `{"id":"t","op":"take","subject":"a\u0085b","policy":"p"}`, `"t"`},

		// Invalid UTF-8 and bad escapes, wherever they are.
		{"invalid UTF-8 in subject", "{\"id\":\"t\",\"op\":\"take\",\"subject\":\"a\xffb\",\"policy\":\"p\"}", `"t"`},
		{"overlong UTF-8", "{\"id\":\"t\",\"op\":\"take\",\"subject\":\"\xc0\xaf\",\"policy\":\"p\"}", `"t"`},
		{"UTF-8 encoded surrogate", "{\"id\":\"t\",\"op\":\"take\",\"subject\":\"\xed\xa0\x80\",\"policy\":\"p\"}", `"t"`},
		{"truncated UTF-8 sequence", "{\"id\":\"t\",\"op\":\"take\",\"subject\":\"\xe2\x82\",\"policy\":\"p\"}", `"t"`},
		{"invalid UTF-8 in unknown key", "{\"id\":\"t\",\"\xff\":1,\"op\":\"ping\"}", `"t"`},
		{"invalid UTF-8 in unknown value", "{\"id\":\"t\",\"x\":[\"\xff\"],\"op\":\"ping\"}", `"t"`},
		{"invalid UTF-8 outside a string", "{\"id\":\"t\",\"op\":\"ping\"\xff}", `"t"`},
		{"bad escape", `{"id":"t","op":"take","subject":"a\xb","policy":"p"}`, `"t"`},
		{"single-quote escape", `{"id":"t","op":"take","subject":"a\'b","policy":"p"}`, `"t"`},
		{"short unicode escape", `{"id":"t","op":"take","subject":"\u12","policy":"p"}`, `"t"`},
		{"non-hex unicode escape", `{"id":"t","op":"take","subject":"\u12G4","policy":"p"}`, `"t"`},
		{"upper-case U escape", `{"id":"t","op":"take","subject":"\U0041","policy":"p"}`, `"t"`},
		{"backslash at end of input", `{"id":"t","op":"take","subject":"\`, `"t"`},
		{"bad escape in unknown key", `{"id":"t","\q":1,"op":"ping"}`, `"t"`},

		// Addressing.
		{"neither policy nor limits", `{"id":"t","op":"take","subject":"s"}`, `"t"`},
		{"limit without window_ms", `{"id":"t","op":"take","subject":"s","limit":5}`, `"t"`},
		{"window_ms without limit", `{"id":"t","op":"peek","subject":"s","window_ms":5}`, `"t"`},
		{"policy and both limits", take(`,"limit":5,"window_ms":1000`), `"t"`},
		{"policy and limit", take(`,"limit":5`), `"t"`},
		{"policy and window_ms", take(`,"window_ms":5`), `"t"`},
		{"policy empty", `{"id":"t","op":"take","subject":"s","policy":""}`, `"t"`},
		{"policy of 65 bytes", `{"id":"t","op":"take","subject":"s","policy":"` + long("p", 65) + `"}`, `"t"`},
		{"policy with colon", `{"id":"t","op":"take","subject":"s","policy":"a:b"}`, `"t"`},
		{"policy with space", `{"id":"t","op":"take","subject":"s","policy":"a b"}`, `"t"`},
		{"policy non-ASCII", `{"id":"t","op":"take","subject":"s","policy":"é"}`, `"t"`},
		{"policy number", `{"id":"t","op":"take","subject":"s","policy":1}`, `"t"`},
		{"policy array", `{"id":"t","op":"take","subject":"s","policy":["p"]}`, `"t"`},

		// Integers: limit.
		{"limit zero", inline(`0`, `1000`), `"t"`},
		{"limit negative", inline(`-1`, `1000`), `"t"`},
		{"limit minus zero", inline(`-0`, `1000`), `"t"`},
		{"limit above max", inline(`1000000001`, `1000`), `"t"`},
		{"limit fraction", inline(`1.5`, `1000`), `"t"`},
		{"limit integral fraction", inline(`1.0`, `1000`), `"t"`},
		{"limit exponent", inline(`1e0`, `1000`), `"t"`},
		{"limit upper-case exponent", inline(`1E2`, `1000`), `"t"`},
		{"limit huge exponent", inline(`1e400`, `1000`), `"t"`},
		{"limit huge integer", inline(`99999999999999999999999`, `1000`), `"t"`},
		{"limit huge negative integer", inline(`-99999999999999999999999`, `1000`), `"t"`},
		{"limit beyond int64", inline(`9223372036854775808`, `1000`), `"t"`},
		{"limit 2^64+1 wraps to 1 in uint64", inline(`18446744073709551617`, `1000`), `"t"`},
		{"limit string", inline(`"5"`, `1000`), `"t"`},
		{"limit true", inline(`true`, `1000`), `"t"`},
		{"limit array", inline(`[5]`, `1000`), `"t"`},
		{"limit leading zero", inline(`05`, `1000`), `"t"`},
		{"limit plus sign", inline(`+5`, `1000`), `"t"`},
		{"limit leading dot", inline(`.5`, `1000`), `"t"`},
		{"limit trailing dot", inline(`5.`, `1000`), `"t"`},
		{"limit bare minus", inline(`-`, `1000`), `"t"`},
		{"limit hex", inline(`0x10`, `1000`), `"t"`},
		{"limit NaN", inline(`NaN`, `1000`), `"t"`},
		{"limit Infinity", inline(`Infinity`, `1000`), `"t"`},

		// Integers: window_ms.
		{"window_ms zero", inline(`5`, `0`), `"t"`},
		{"window_ms negative", inline(`5`, `-1000`), `"t"`},
		{"window_ms above 31 days", inline(`5`, `2678400001`), `"t"`},
		{"window_ms fraction", inline(`5`, `1000.5`), `"t"`},
		{"window_ms exponent", inline(`5`, `1e3`), `"t"`},
		{"window_ms string", inline(`5`, `"1000"`), `"t"`},
		{"window_ms huge", inline(`5`, `99999999999999999999999`), `"t"`},

		// Integers: cost.
		{"cost zero", take(`,"cost":0`), `"t"`},
		{"cost negative", take(`,"cost":-1`), `"t"`},
		{"cost minus zero", take(`,"cost":-0`), `"t"`},
		{"cost above max", take(`,"cost":1000000001`), `"t"`},
		{"cost fraction", take(`,"cost":1.5`), `"t"`},
		{"cost exponent", take(`,"cost":1e0`), `"t"`},
		{"cost string", take(`,"cost":"1"`), `"t"`},
		{"cost false", take(`,"cost":false`), `"t"`},
		{"cost huge", take(`,"cost":1e400`), `"t"`},

		// Integers: timeout_ms.
		{"timeout_ms zero", take(`,"timeout_ms":0`), `"t"`},
		{"timeout_ms negative", take(`,"timeout_ms":-5`), `"t"`},
		{"timeout_ms above an hour", take(`,"timeout_ms":3600001`), `"t"`},
		{"timeout_ms fraction", take(`,"timeout_ms":0.5`), `"t"`},
		{"timeout_ms string", take(`,"timeout_ms":"100"`), `"t"`},

		// request_id.
		{"request_id empty", take(`,"request_id":""`), `"t"`},
		{"request_id of 65 bytes", take(`,"request_id":"` + long("r", 65) + `"`), `"t"`},
		{"request_id with dot", take(`,"request_id":"a.b"`), `"t"`},
		{"request_id with colon", take(`,"request_id":"a:b"`), `"t"`},
		{"request_id with space", take(`,"request_id":"a b"`), `"t"`},
		{"request_id with slash", take(`,"request_id":"a/b"`), `"t"`},
		{"request_id non-ASCII", take(`,"request_id":"é"`), `"t"`},
		{"request_id number", take(`,"request_id":12`), `"t"`},

		// Nesting.
		{"unknown field nested 33 deep", `{"id":"t","x":` + long("[", 33) + long("]", 33) + `,"op":"ping"}`, `"t"`},
		{"unknown field nested 10000 deep", `{"id":"t","x":` + long(`{"a":`, 10000) + `1` + long("}", 10000) + `,"op":"ping"}`, `"t"`},
		{"unbalanced nesting", `{"id":"t","x":[{"a":1]},"op":"ping"}`, `"t"`},
		{"bad literal", `{"id":"t","x":tru,"op":"ping"}`, `"t"`},
		{"literal with suffix", `{"id":"t","x":nullx,"op":"ping"}`, `"t"`},
		{"known field null with suffix", `{"id":"t","op":nullx}`, `"t"`},

		// The id is echoed even when the error comes before it.
		{"id after unknown op", `{"op":"drop","id":9}`, "9"},
		{"id after non-string subject", `{"op":"take","subject":5,"policy":"p","id":9}`, "9"},
		{"id after fractional limit", `{"op":"take","subject":"s","limit":1.5,"window_ms":1,"id":9}`, "9"},
		{"id after string cost", `{"op":"take","subject":"s","policy":"p","cost":"1","id":9}`, "9"},
		{"id after duplicate", `{"op":"ping","op":"ping","id":9}`, "9"},
		{"id after op null duplicate", `{"op":null,"op":"ping","id":"x"}`, `"x"`},
		{"id after wrongly typed id", `{"op":"ping","id":9,"id":true}`, "9"},
	}
	seen := make(map[string]bool)
	for _, tt := range tests {
		if seen[tt.name] {
			t.Fatalf("duplicate case name %q", tt.name)
		}
		seen[tt.name] = true
		t.Run(tt.name, func(t *testing.T) {
			var r protocol.Request
			err := protocol.Decode([]byte(tt.line), &r)
			if err == nil {
				t.Fatalf("Decode(%q) succeeded with %+v, want INVALID", tt.line, view(&r))
			}
			if !errors.Is(err, protocol.ErrInvalid) {
				t.Errorf("Decode(%q) = %v, want an error matching ErrInvalid", tt.line, err)
			}
			if errors.Is(err, protocol.ErrTooLarge) {
				t.Errorf("Decode(%q) = %v matches ErrTooLarge", tt.line, err)
			}
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Code != protocol.CodeInvalid || pe.Message == "" {
				t.Errorf("Decode(%q) = %#v, want *protocol.Error with code INVALID and a message", tt.line, err)
			}
			if got := string(r.ID); got != tt.wantID {
				t.Errorf("Decode(%q): ID = %q, want %q", tt.line, got, tt.wantID)
			}
			if tt.wantID == "" && r.ID != nil {
				t.Errorf("Decode(%q): ID = %#v, want nil so the reply omits it", tt.line, r.ID)
			}
		})
	}
}

// A string that is not valid Unicode is INVALID wherever it is, and the
// message names where: encoding/json would decode each lone surrogate or
// invalid byte to U+FFFD, so "sur\ud800" and "sur\udbff" would be one
// subject and share one window.
func TestDecodeRefusesStringsThatAreNotUnicode(t *testing.T) {
	// take builds a take by policy with the given subject and extra fields.
	take := func(subject, extra string) string {
		return `{"id":"t","op":"take","subject":"` + subject + `","policy":"p"` + extra + `}`
	}
	tests := []struct {
		name   string
		line   string
		wantID string // the id the error reply echoes
		want   string // the message, exactly
	}{
		{"lone high surrogate", take(`sur\ud800`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"last high surrogate", take(`sur\udbff`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \udbff`},
		{"lone low surrogate", take(`\udc00`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \udc00`},
		{"last low surrogate in upper case", take(`a\uDFFF`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \udfff`},
		{"low surrogate before a high one", take(`\ude00\ud83d`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ude00`},
		{"high surrogate before a non-surrogate escape", take(`\ud800\u0041`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"high surrogate before another escape", take(`\ud800\n`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"high surrogate before a raw character", take(`\ud800A`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"two high surrogates then a pair", take(`\ud800\ud83d\ude00`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"high surrogate at the end", take(`x\ud83d`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ud83d`},
		{"pair then a lone low surrogate", take(`\ud83d\ude00\ude00`, ""), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ude00`},
		{"policy", `{"id":"t","op":"take","subject":"s","policy":"p\ud800"}`, `"t"`, `policy must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"request_id", take("s", `,"request_id":"r\udc00"`), `"t"`, `request_id must be valid Unicode: lone UTF-16 surrogate \udc00`},
		{"op", `{"id":"t","op":"ping\ud800"}`, `"t"`, `op must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"algorithm", `{"id":"t","op":"take","subject":"s","algorithm":"\ud800","limit":1,"window_ms":1}`, `"t"`, `algorithm must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"string id, not echoed", `{"id":"i\ud800","op":"ping"}`, "", `id must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"unknown field", `{"id":"t","x":"\ud800","op":"ping"}`, `"t"`, `field "x" must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"nested in an unknown field", `{"id":"t","x":[{"k":"\udc00"}],"op":"ping"}`, `"t"`, `field "x" must be valid Unicode: lone UTF-16 surrogate \udc00`},
		{"key nested in an unknown field", `{"id":"t","x":{"\ud800":1},"op":"ping"}`, `"t"`, `field "x" must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"object key", `{"id":"t","\ud800":1,"op":"ping"}`, `"t"`, `object key must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"before the id", `{"op":"take","subject":"\ud800","policy":"p","id":9}`, "9", `subject must be valid Unicode: lone UTF-16 surrogate \ud800`},
		{"first of two faults", take(`\ud800`, `,"request_id":"\udc00"`), `"t"`, `subject must be valid Unicode: lone UTF-16 surrogate \ud800`},

		// Raw bytes that are not UTF-8 were refused before too; the message
		// now names the field, and the id after them is echoed.
		{"invalid UTF-8 byte", take("a\xffb", ""), `"t"`, `subject must be valid Unicode: invalid UTF-8 byte 0xff`},
		{"overlong encoding", take("\xc0\xaf", ""), `"t"`, `subject must be valid Unicode: invalid UTF-8 byte 0xc0`},
		{"UTF-8 encoded surrogate", take("\xed\xa0\x80", ""), `"t"`, `subject must be valid Unicode: invalid UTF-8 byte 0xed`},
		{"truncated sequence", take("\xe2\x82", ""), `"t"`, `subject must be valid Unicode: invalid UTF-8 byte 0xe2`},
		{"invalid UTF-8 before the id", "{\"op\":\"take\",\"subject\":\"\xff\",\"policy\":\"p\",\"id\":9}", "9", `subject must be valid Unicode: invalid UTF-8 byte 0xff`},
		{"invalid UTF-8 in an unknown field", "{\"id\":\"t\",\"x\":[\"\xff\"],\"op\":\"ping\"}", `"t"`, `field "x" must be valid Unicode: invalid UTF-8 byte 0xff`},
		{"invalid UTF-8 in a string id, not echoed", "{\"id\":\"\xf7\",\"op\":\"ping\"}", "", `id must be valid Unicode: invalid UTF-8 byte 0xf7`},
		{"invalid UTF-8 in an object key", "{\"id\":\"t\",\"\xfe\":1,\"op\":\"ping\"}", `"t"`, `object key must be valid Unicode: invalid UTF-8 byte 0xfe`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r protocol.Request
			err := protocol.Decode([]byte(tt.line), &r)
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Code != protocol.CodeInvalid || !errors.Is(err, protocol.ErrInvalid) {
				t.Fatalf("Decode(%q) = %v (subject %q), want INVALID", tt.line, err, r.Subject)
			}
			if pe.Message != tt.want {
				t.Errorf("Decode(%q) message\n got %q\nwant %q", tt.line, pe.Message, tt.want)
			}
			if got := string(r.ID); got != tt.wantID {
				t.Errorf("Decode(%q): ID = %q, want %q", tt.line, got, tt.wantID)
			}
		})
	}
}

// Subjects that encoding/json would decode to one string are told apart:
// each lone surrogate is refused, while the character U+FFFD, raw or
// escaped, is a subject of its own.
func TestDecodeDistinctSubjectsStayDistinct(t *testing.T) {
	subjects := make(map[string]string) // decoded subject -> raw form
	for _, raw := range []string{`sur\ud800`, `sur\udbff`, `sur\udc00`, `sur\udfff`, `sur\ud800\u0041`, "sur\xff", "sur\xed\xa0\x80",
		`sur\ufffd`, `sur`, `sur\ud83d\ude00`, `sur\ud83d\ude01`, `sur\u0041`} {
		var r protocol.Request
		err := protocol.Decode([]byte(`{"op":"take","subject":"`+raw+`","policy":"p"}`), &r)
		if err != nil {
			if !errors.Is(err, protocol.ErrInvalid) {
				t.Fatalf("subject %q: %v, want INVALID", raw, err)
			}
			continue
		}
		if prev, ok := subjects[r.Subject]; ok {
			t.Errorf("subjects %q and %q both decode to %q", prev, raw, r.Subject)
		}
		subjects[r.Subject] = raw
	}
	// Every valid form above is accepted: the raw U+FFFD is the escaped one.
	if len(subjects) != 5 {
		t.Errorf("accepted subjects %q, want the 5 valid ones", subjects)
	}
	var raw, escaped protocol.Request
	if protocol.Decode([]byte(`{"op":"take","subject":"sur\ufffd","policy":"p"}`), &escaped) != nil ||
		protocol.Decode([]byte("{\"op\":\"take\",\"subject\":\"sur\ufffd\",\"policy\":\"p\"}"), &raw) != nil ||
		raw.Subject != escaped.Subject || raw.Subject != "sur\ufffd" {
		t.Errorf("U+FFFD raw %q and escaped %q, want both %q", raw.Subject, escaped.Subject, "sur\ufffd")
	}
}

// A Request is reused across lines on a connection: nothing may leak from
// one line into the next, and nothing decoded may alias the line buffer,
// which the line reader overwrites.
func TestDecodeReuse(t *testing.T) {
	var r protocol.Request
	first := []byte(`{"id":"abc","op":"take","subject":"s","limit":5,"window_ms":9,"cost":3,"request_id":"r","timeout_ms":4}`)
	if err := protocol.Decode(first, &r); err != nil {
		t.Fatal(err)
	}
	for i := range first {
		first[i] = 'X'
	}
	if got := view(&r); got.ID != `"abc"` || got.Subject != "s" || got.RequestID != "r" {
		t.Fatalf("decoded fields changed with the line buffer: %+v", got)
	}
	id := r.ID

	if err := protocol.Decode([]byte(`{"id":1,"op":"ping"}`), &r); err != nil {
		t.Fatal(err)
	}
	if got, want := view(&r), (want{ID: "1", Op: protocol.OpPing, Cost: 1}); got != want {
		t.Errorf("after reuse got %+v, want %+v", got, want)
	}
	if &id[:1][0] != &r.ID[:1][0] {
		t.Errorf("ID buffer not reused")
	}

	if err := protocol.Decode([]byte(`{"op":"ping"}`), &r); err != nil {
		t.Fatal(err)
	}
	if r.ID != nil {
		t.Errorf("ID = %q after a line without id, want nil", r.ID)
	}

	if err := protocol.Decode([]byte(`{"op":"take"}`), &r); err == nil {
		t.Fatal("take without subject accepted")
	}
	if r.ID != nil || r.Op != protocol.OpTake || r.Cost != 1 {
		t.Errorf("after a failed decode: %+v", view(&r))
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[protocol.Op]string{
		protocol.OpTake: "take", protocol.OpPeek: "peek", protocol.OpPing: "ping",
		protocol.OpUnknown: "unknown", protocol.Op(200): "unknown",
	} {
		if got := op.String(); got != want {
			t.Errorf("Op(%d).String() = %q, want %q", op, got, want)
		}
	}
}

func TestErrorIs(t *testing.T) {
	e := &protocol.Error{Code: protocol.CodeInvalid, Message: "anything"}
	if !errors.Is(e, protocol.ErrInvalid) {
		t.Error("an INVALID error does not match ErrInvalid")
	}
	if errors.Is(e, protocol.ErrTooLarge) {
		t.Error("an INVALID error matches ErrTooLarge")
	}
	if errors.Is(e, errors.New("INVALID: anything")) {
		t.Error("an INVALID error matches a plain error")
	}
}

// An error message quotes at most 64 bytes of what the client sent, so a
// reply stays short however long the line.
func TestDecodeMessagesQuoteLittle(t *testing.T) {
	long := strings.Repeat("é", 5000)
	for _, tt := range []struct{ line, prefix string }{
		{`{"` + long + `":"\ud800","op":"ping"}`, `field "` + strings.Repeat("é", 32) + `"... must be valid Unicode`},
		{`{"op":"` + long + `"}`, `unknown op "` + strings.Repeat("é", 32) + `"...: one of`},
	} {
		var r protocol.Request
		err := protocol.Decode([]byte(tt.line), &r)
		pe, ok := errors.AsType[*protocol.Error](err)
		if !ok || !strings.HasPrefix(pe.Message, tt.prefix) || len(pe.Message) > 200 {
			t.Errorf("Decode of a %d-byte line = %v, want a message of at most 200 bytes starting %q", len(tt.line), err, tt.prefix)
		}
	}
}
