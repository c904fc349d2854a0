package sidecar

import (
	"strconv"
	"testing"

	"quotad/integration/redistest"
)

const testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestTraceContextChangesNoReply: a request with a trace context, valid or
// not, gets the reply it gets without one, byte for byte; the invalid
// ones are counted.
func TestTraceContextChangesNoReply(t *testing.T) {
	r := redistest.Start(t)
	ts := startServer(t, Options{Store: openStore(t, r.URL()), AllowInline: true})
	c := ts.dial(t)
	waitRedisOK(t, c)
	traces := []struct {
		fields  string
		invalid bool
	}{
		{``, false},
		{`,"traceparent":"` + testTraceParent + `"`, false},
		{`,"traceparent":"` + testTraceParent + `","tracestate":"a=b"`, false},
		{`,"traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"`, true},
		{`,"traceparent":42`, true},
		{`,"traceparent":"` + testTraceParent + `","tracestate":"A=b"`, true},
		{`,"traceparent":"nonsense","traceparent":"nonsense"`, true},
	}
	invalid := 0.0
	for i, tr := range traces {
		for _, line := range []struct{ plain, traced string }{
			{`{"op":"peek","id":1,"subject":"never-taken","limit":3,"window_ms":60000}`, ""},
			{`{"op":"take","id":2,"subject":"s","policy":"nope"}`, ""},
			{`{"op":"take","id":3,"subject":"s","limit":0,"window_ms":60000}`, ""},
			{`{"op":"ping","id":4}`, ""},
		} {
			traced := line.plain[:len(line.plain)-1] + tr.fields + `}`
			want := c.callRaw(line.plain)
			if got := c.callRaw(traced); got != want {
				t.Errorf("%s\n got  %s\n want %s (as without the trace context)", traced, got, want)
			}
			if tr.invalid {
				invalid++
			}
		}
		// A take decides as without: the first of a limit of 1 is allowed,
		// the second denied.
		take := inlineTake("t", "take-"+strconv.Itoa(i), 1, tr.fields)
		if rep := c.call(take); !rep.OK || !rep.Allowed {
			t.Errorf("%s: %+v, want allowed", take, rep)
		}
		if rep := c.call(take); !rep.OK || rep.Allowed {
			t.Errorf("%s again: %+v, want denied", take, rep)
		}
		if tr.invalid {
			invalid += 2
		}
	}
	if got := metricValue(t, ts.Server, "quotad_trace_context_invalid_total", nil); got != invalid {
		t.Errorf("quotad_trace_context_invalid_total = %v, want %v", got, invalid)
	}
}
