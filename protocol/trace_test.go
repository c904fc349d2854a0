package protocol_test

import (
	"encoding/hex"
	"strings"
	"testing"

	"quotad/protocol"
)

const (
	traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentID = "00f067aa0ba902b7"
	parent   = "00-" + traceID + "-" + parentID + "-01"
)

// traceView is what a test compares of a decoded trace context.
type traceView struct {
	Valid    bool
	TraceID  string
	ParentID string
	Flags    byte
	State    string
	Invalid  bool
}

func viewTrace(r *protocol.Request) traceView {
	v := traceView{Valid: r.Trace.Valid(), Flags: r.Trace.Flags, State: r.Trace.State, Invalid: r.TraceInvalid}
	if v.Valid {
		v.TraceID, v.ParentID = hex.EncodeToString(r.Trace.TraceID[:]), hex.EncodeToString(r.Trace.ParentID[:])
	}
	return v
}

func TestDecodeTraceContext(t *testing.T) {
	const take = `{"op":"take","subject":"s","policy":"api"`
	valid := traceView{Valid: true, TraceID: traceID, ParentID: parentID, Flags: 1}
	withState := valid
	withState.State = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	invalid := traceView{Invalid: true}
	tests := []struct {
		name string
		line string
		want traceView
	}{
		{"none", take + `}`, traceView{}},
		{"traceparent", take + `,"traceparent":"` + parent + `"}`, valid},
		{"traceparent and tracestate", take + `,"traceparent":"` + parent + `","tracestate":"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}`, withState},
		{"tracestate first", `{"tracestate":"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7","traceparent":"` + parent + `","op":"take","subject":"s","policy":"api"}`, withState},
		{"not sampled", take + `,"traceparent":"00-` + traceID + `-` + parentID + `-00"}`,
			traceView{Valid: true, TraceID: traceID, ParentID: parentID}},
		{"later version with more fields", take + `,"traceparent":"01-` + traceID + `-` + parentID + `-01-what-comes-next"}`, valid},
		{"escaped", take + `,"traceparent":"00-` + traceID + `-` + parentID + `\u002d01"}`, valid},
		{"null is absent", take + `,"traceparent":null,"tracestate":null}`, traceView{}},
		{"tracestate alone is ignored", take + `,"tracestate":"a=b"}`, traceView{}},
		{"empty tracestate members", take + `,"traceparent":"` + parent + `","tracestate":" ,a=b ,, c@d=e "}`,
			traceView{Valid: true, TraceID: traceID, ParentID: parentID, Flags: 1, State: " ,a=b ,, c@d=e "}},

		{"not a string", take + `,"traceparent":42}`, invalid},
		{"an object", take + `,"traceparent":{"a":[1]}}`, invalid},
		{"empty", take + `,"traceparent":""}`, invalid},
		{"upper-case hex", take + `,"traceparent":"00-` + strings.ToUpper(traceID) + `-` + parentID + `-01"}`, invalid},
		{"zero trace id", take + `,"traceparent":"00-` + strings.Repeat("0", 32) + `-` + parentID + `-01"}`, invalid},
		{"zero parent id", take + `,"traceparent":"00-` + traceID + `-` + strings.Repeat("0", 16) + `-01"}`, invalid},
		{"version ff", take + `,"traceparent":"ff-` + traceID + `-` + parentID + `-01"}`, invalid},
		{"version 00 with more", take + `,"traceparent":"` + parent + `-x"}`, invalid},
		{"later version run on", take + `,"traceparent":"01-` + traceID + `-` + parentID + `-01x"}`, invalid},
		{"short", take + `,"traceparent":"00-` + traceID[:31] + `-` + parentID + `-01"}`, invalid},
		{"given twice", take + `,"traceparent":"` + parent + `","traceparent":"` + parent + `"}`, invalid},
		{"bad tracestate keeps traceparent", take + `,"traceparent":"` + parent + `","tracestate":"Upper=x"}`,
			traceView{Valid: true, TraceID: traceID, ParentID: parentID, Flags: 1, Invalid: true}},
		{"tracestate given twice", take + `,"traceparent":"` + parent + `","tracestate":"a=b","tracestate":"a=b"}`,
			traceView{Valid: true, TraceID: traceID, ParentID: parentID, Flags: 1, Invalid: true}},
		{"tracestate too long", take + `,"traceparent":"` + parent + `","tracestate":"a=` + strings.Repeat("x", 256) + `,b=` + strings.Repeat("y", 256) + `"}`,
			traceView{Valid: true, TraceID: traceID, ParentID: parentID, Flags: 1, Invalid: true}},
		{"inside a check", `{"op":"take","traceparent":"` + parent + `","checks":[{"policy":"p","subject":"a","traceparent":"` + parent + `"}]}`,
			traceView{Valid: true, TraceID: traceID, ParentID: parentID, Flags: 1, Invalid: true}},
		{"on a ping", `{"op":"ping","traceparent":"` + parent + `"}`, valid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r protocol.Request
			if err := protocol.Decode([]byte(tt.line), &r); err != nil {
				t.Fatalf("Decode(%s): %v; a trace context is never an error", tt.line, err)
			}
			if got := viewTrace(&r); got != tt.want {
				t.Errorf("Decode(%s):\n got  %+v\n want %+v", tt.line, got, tt.want)
			}
		})
	}
}

// TestDecodeTraceContextReuse: a request decoded into a Request that held
// a trace context does not keep it.
func TestDecodeTraceContextReuse(t *testing.T) {
	var r protocol.Request
	if err := protocol.Decode([]byte(`{"op":"ping","traceparent":"`+parent+`","tracestate":"a=b","x":1}`), &r); err != nil {
		t.Fatal(err)
	}
	if err := protocol.Decode([]byte(`{"op":"ping","traceparent":7}`), &r); err != nil {
		t.Fatal(err)
	}
	if got := viewTrace(&r); got != (traceView{Invalid: true}) {
		t.Errorf("got %+v after reuse", got)
	}
}

func TestValidTraceState(t *testing.T) {
	for _, s := range []string{"", "a=b", "a=b,c=d", "tenant@sys=v", "0t@s=v", "a-_*/=x y", " a=1 , b=2 ", strings.Repeat("k=v,", 8)[:len("k=v")]} {
		if !protocol.ValidTraceState(s) {
			t.Errorf("ValidTraceState(%q) = false", s)
		}
	}
	members := make([]string, 33)
	for i := range members {
		members[i] = "k" + strings.Repeat("x", i) + "=v"
	}
	for _, s := range []string{"a", "=b", "A=b", "1a=b", "a=b=c", "a=,b=c", "a=b ,a=c", "a=b\x01", "a=b \x01", "a@=b", "@s=b",
		"t@" + strings.Repeat("s", 15) + "=v", strings.Join(members, ","), "a=" + strings.Repeat("v", 257)} {
		if protocol.ValidTraceState(s) {
			t.Errorf("ValidTraceState(%q) = true", s)
		}
	}
}
