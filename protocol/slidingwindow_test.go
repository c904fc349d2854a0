package protocol_test

import (
	"errors"
	"testing"

	"quotad/limits"
	"quotad/protocol"
)

func TestDecodeSlidingWindow(t *testing.T) {
	var r protocol.Request
	line := `{"op":"take","subject":"s","algorithm":"sliding_window","limit":100,"window_ms":60000}`
	if err := protocol.Decode([]byte(line), &r); err != nil {
		t.Fatalf("Decode(%s): %v", line, err)
	}
	if got := r.InlineShape(); got != (limits.Sliding{Limit: 100, WindowMS: 60000}) || r.InlineAlgorithm() != "sliding_window" {
		t.Fatalf("Decode(%s): shape %#v, algorithm %q", line, got, r.InlineAlgorithm())
	}
	for name, line := range map[string]string{
		"without window_ms":     `{"op":"take","subject":"s","algorithm":"sliding_window","limit":1}`,
		"without limit":         `{"op":"take","subject":"s","algorithm":"sliding_window","window_ms":1}`,
		"limit 0":               `{"op":"take","subject":"s","algorithm":"sliding_window","limit":0,"window_ms":1}`,
		"window over 31 days":   `{"op":"take","subject":"s","algorithm":"sliding_window","limit":1,"window_ms":2678400001}`,
		"with a token field":    `{"op":"take","subject":"s","algorithm":"sliding_window","limit":1,"window_ms":1,"rate":1}`,
		"with lease_ms":         `{"op":"take","subject":"s","algorithm":"sliding_window","limit":1,"window_ms":1,"lease_ms":1}`,
		"with a policy as well": `{"op":"take","subject":"s","policy":"p","algorithm":"sliding_window"}`,
	} {
		var r protocol.Request
		if err := protocol.Decode([]byte(line), &r); !errors.Is(err, protocol.ErrInvalid) {
			t.Errorf("%s: Decode(%s) = %v, want INVALID", name, line, err)
		}
	}
}
