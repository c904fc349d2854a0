package protocol_test

import (
	"bytes"
	"testing"

	"quotad/protocol"
)

// takeLine is a take with every field, as a client with idempotency sends it.
var takeLine = []byte(`{"id":7,"op":"take","subject":"user:42","limit":5,"window_ms":60000,"cost":2,"request_id":"order-1","timeout_ms":250}`)

func BenchmarkDecodeTake(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(takeLine)))
	var r protocol.Request
	for b.Loop() {
		if err := protocol.Decode(takeLine, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendTake(b *testing.B) {
	b.ReportAllocs()
	id := []byte("7")
	reply := protocol.TakeReply{Allowed: true, Limit: 5, Used: 2, Remaining: 3, ResetMS: 59990}
	buf := protocol.AppendTake(nil, id, reply)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		buf = protocol.AppendTake(buf[:0], id, reply)
	}
}

// loopReader returns its data over and over, like a client that never stops
// sending.
type loopReader struct {
	data []byte
	off  int
}

func (l *loopReader) Read(p []byte) (int, error) {
	n := copy(p, l.data[l.off:])
	l.off = (l.off + n) % len(l.data)
	return n, nil
}

func BenchmarkReadLine(b *testing.B) {
	b.ReportAllocs()
	data := bytes.Repeat(append(bytes.Clone(takeLine), '\n'), 64)
	b.SetBytes(int64(len(takeLine) + 1))
	lr := protocol.NewLineReader(&loopReader{data: data}, 4096, 16384)
	for b.Loop() {
		if _, err := lr.ReadLine(); err != nil {
			b.Fatal(err)
		}
	}
}
