package protocol_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"

	"quotad/protocol"
)

// tooLarge stands for an ErrTooLarge result in the expected lines.
const tooLarge = "<TOO_LARGE>"

// readAll reads lines until io.EOF, recording ErrTooLarge as tooLarge. Any
// other error fails the test.
func readAll(t testing.TB, lr *protocol.LineReader) []string {
	t.Helper()
	var got []string
	for i := 0; ; i++ {
		if i > 1e6 {
			t.Fatal("ReadLine never returned io.EOF")
		}
		line, err := lr.ReadLine()
		switch {
		case err == nil:
			got = append(got, string(line))
		case errors.Is(err, protocol.ErrTooLarge):
			if line != nil {
				t.Errorf("ReadLine returned %q with ErrTooLarge", line)
			}
			got = append(got, tooLarge)
		case errors.Is(err, protocol.ErrWouldBlock):
			if line != nil {
				t.Errorf("ReadLine returned %q with ErrWouldBlock", line)
			}
			// A non-blocking source had nothing for now: read again.
		case err == io.EOF:
			// Stays at EOF.
			if _, err := lr.ReadLine(); err != io.EOF {
				t.Errorf("ReadLine after io.EOF = %v, want io.EOF", err)
			}
			return got
		default:
			t.Fatalf("ReadLine: %v", err)
		}
	}
}

// chunkReader returns the data in reads of random sizes from 1 to max.
type chunkReader struct {
	data []byte
	rnd  *rand.Rand
	max  int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := 1 + c.rnd.IntN(c.max)
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// wouldBlockReader is a non-blocking source: between random chunks it has
// nothing for now, at most once in a row. At end of input it says so, as a
// socket does.
type wouldBlockReader struct {
	chunkReader
	blocked bool
}

func (w *wouldBlockReader) Read(p []byte) (int, error) {
	if !w.blocked && len(w.data) > 0 && w.rnd.IntN(2) == 0 {
		w.blocked = true
		return 0, protocol.ErrWouldBlock
	}
	w.blocked = false
	return w.chunkReader.Read(p)
}

// readers returns the ways a test feeds input to a LineReader: whole, a
// byte at a time, in random chunks, with EOF arriving with the last data,
// and in chunks from a source that often has nothing for now.
func readers(input string, seed uint64) map[string]io.Reader {
	return map[string]io.Reader{
		"would block": &wouldBlockReader{chunkReader: chunkReader{data: []byte(input), rnd: rand.New(rand.NewPCG(seed, 2)), max: 7}},
		"whole":       strings.NewReader(input),
		"one byte":    iotest.OneByteReader(strings.NewReader(input)),
		"half":        iotest.HalfReader(strings.NewReader(input)),
		"chunks":      &chunkReader{data: []byte(input), rnd: rand.New(rand.NewPCG(seed, 1)), max: 37},
		"data error":  iotest.DataErrReader(strings.NewReader(input)),
	}
}

func TestLineReader(t *testing.T) {
	const max = 20
	x := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name    string
		input   string
		bufSize int
		want    []string
	}{
		{"empty input", "", 64, nil},
		{"one line", "a\n", 64, []string{"a"}},
		{"two lines", "a\nbc\n", 64, []string{"a", "bc"}},
		{"CRLF", "a\r\nbc\r\n", 64, []string{"a", "bc"}},
		{"mixed terminators", "a\r\nb\nc\r\n", 64, []string{"a", "b", "c"}},
		{"blank lines returned", "\n\r\n\na\n\n", 64, []string{"", "", "", "a", ""}},
		{"only a CR", "\r", 64, []string{""}},
		{"CR inside a line kept", "a\rb\n", 64, []string{"a\rb"}},
		{"only the last CR trimmed", "a\r\r\n", 64, []string{"a\r"}},
		{"final line without newline", "a\nlast", 64, []string{"a", "last"}},
		{"final line with CR only", "a\nlast\r", 64, []string{"a", "last"}},
		{"spaces kept", "  a  \n", 64, []string{"  a  "}},

		{"exactly max", x(max) + "\n", 64, []string{x(max)}},
		{"exactly max with CRLF", x(max) + "\r\n", 64, []string{x(max)}},
		{"max+1", x(max+1) + "\n", 64, []string{tooLarge}},
		{"max+1 with CRLF", x(max+1) + "\r\n", 64, []string{tooLarge}},
		{"max then a stray CR", x(max) + "\ry\n", 64, []string{tooLarge}},
		{"oversized then normal", x(3*max) + "\nok\n", 64, []string{tooLarge, "ok"}},
		{"oversized CRLF then normal", x(3*max) + "\r\nok\r\n", 64, []string{tooLarge, "ok"}},
		{"normal, oversized, normal", "a\n" + x(max+1) + "\nb\n", 64, []string{"a", tooLarge, "b"}},
		{"two oversized in a row", x(max+5) + "\n" + x(500) + "\nc\n", 64, []string{tooLarge, tooLarge, "c"}},
		{"oversized last line at EOF", "a\n" + x(max+1), 64, []string{"a", tooLarge}},
		{"exactly max last line at EOF", "a\n" + x(max), 64, []string{"a", x(max)}},
		{"exactly max and CR at EOF", "a\n" + x(max) + "\r", 64, []string{"a", x(max)}},
		{"very long last line at EOF", "a\n" + x(10000), 64, []string{"a", tooLarge}},

		// A buffer smaller than max: lines are assembled across fills.
		{"small buffer, line spans fills", x(max-1) + "\n", 16, []string{x(max - 1)}},
		{"small buffer, exactly max", x(max) + "\n" + x(max) + "\r\n", 16, []string{x(max), x(max)}},
		{"small buffer, max+1", x(max+1) + "\nok\n", 16, []string{tooLarge, "ok"}},
		{"small buffer, max+1 with CRLF", x(max+1) + "\r\nok\n", 16, []string{tooLarge, "ok"}},
		{"small buffer, max then stray CR", x(max) + "\ryy\nok\n", 16, []string{tooLarge, "ok"}},
		{"small buffer, many buffers long", x(1000) + "\n" + x(5) + "\n", 16, []string{tooLarge, x(5)}},
		{"small buffer, long last line", x(1000), 16, []string{tooLarge}},
		{"small buffer, exactly max at EOF", x(max), 16, []string{x(max)}},
		{"buffer size below minimum", x(max) + "\nab\n", 1, []string{x(max), "ab"}},
	}
	for i, tt := range tests {
		for how, r := range readers(tt.input, uint64(i)) {
			t.Run(tt.name+"/"+how, func(t *testing.T) {
				got := readAll(t, protocol.NewLineReader(r, tt.bufSize, max))
				if !equalLines(got, tt.want) {
					t.Errorf("lines of %q:\n got %q\nwant %q", tt.input, got, tt.want)
				}
			})
		}
	}
}

func equalLines(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Lines of every length around the buffer size and the limit, with both
// terminators, read in random chunks: each line comes back whole or as
// ErrTooLarge, and the next line is never affected.
func TestLineReaderLengths(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, bufSize := range []int{16, 17, 31, 64, 4096} {
		for _, max := range []int{1, 15, 16, 17, 32, 100} {
			var in bytes.Buffer
			var want []string
			for n := 0; n <= max+bufSize+2; n++ {
				line := strings.Repeat(string(rune('a'+n%26)), n)
				in.WriteString(line)
				if n%2 == 0 {
					in.WriteString("\r\n")
				} else {
					in.WriteString("\n")
				}
				if n > max {
					want = append(want, tooLarge)
				} else {
					want = append(want, line)
				}
				in.WriteString("#\n")
				want = append(want, "#")
			}
			r := &chunkReader{data: in.Bytes(), rnd: rnd, max: 2 * bufSize}
			got := readAll(t, protocol.NewLineReader(r, bufSize, max))
			if !equalLines(got, want) {
				t.Errorf("bufSize %d, max %d:\n got %q\nwant %q", bufSize, max, got, want)
			}
		}
	}
}

// A read error other than EOF is returned as is, wrapped or not, and not
// mistaken for a line.
func TestLineReaderReadError(t *testing.T) {
	boom := errors.New("boom")
	for _, input := range []string{"", "partial", "a\n"} {
		r := io.MultiReader(strings.NewReader(input), iotest.ErrReader(boom))
		lr := protocol.NewLineReader(r, 16, 100)
		var err error
		for range 3 {
			var line []byte
			line, err = lr.ReadLine()
			if err != nil {
				break
			}
			if string(line) != "a" {
				t.Errorf("input %q: ReadLine = %q before the error", input, line)
			}
		}
		if !errors.Is(err, boom) {
			t.Errorf("input %q: ReadLine error = %v, want boom", input, err)
		}
	}

	// While skipping an oversized line.
	r := io.MultiReader(strings.NewReader(strings.Repeat("x", 200)), iotest.ErrReader(boom))
	if _, err := protocol.NewLineReader(r, 16, 100).ReadLine(); !errors.Is(err, boom) {
		t.Errorf("error while skipping an oversized line = %v, want boom", err)
	}
}

// Buffered tells a server whether more pipelined lines are already in hand,
// so it can flush replies only when the client is waiting.
func TestLineReaderBuffered(t *testing.T) {
	lr := protocol.NewLineReader(strings.NewReader("a\nbb\n"), 64, 100)
	if n := lr.Buffered(); n != 0 {
		t.Errorf("Buffered before any read = %d, want 0", n)
	}
	if _, err := lr.ReadLine(); err != nil {
		t.Fatal(err)
	}
	if n := lr.Buffered(); n != 3 {
		t.Errorf("Buffered after the first line = %d, want 3", n)
	}
	if _, err := lr.ReadLine(); err != nil {
		t.Fatal(err)
	}
	if n := lr.Buffered(); n != 0 {
		t.Errorf("Buffered after the last line = %d, want 0", n)
	}
}

// The returned slice is valid until the next call; a caller that keeps a
// line must copy it. This pins that a line is not silently shared with a
// later one in the other direction: reading on does not change what a copy
// holds, and assembled long lines are not corrupted by the next fill.
func TestLineReaderLongLineThenShort(t *testing.T) {
	long := strings.Repeat("L", 50)
	lr := protocol.NewLineReader(iotest.OneByteReader(strings.NewReader(long+"\nshort\n"+long+"\n")), 16, 64)
	for _, want := range []string{long, "short", long} {
		line, err := lr.ReadLine()
		if err != nil {
			t.Fatal(err)
		}
		if string(line) != want {
			t.Fatalf("ReadLine = %q, want %q", line, want)
		}
	}
}

// HasLine tells a server whether the next line can be read without
// waiting for the client, so it can gather the lines of one read.
func TestLineReaderHasLine(t *testing.T) {
	lr := protocol.NewLineReader(strings.NewReader("a\nbb\ncc"), 64, 100)
	if lr.HasLine() {
		t.Error("HasLine before any read = true")
	}
	for i, want := range []bool{true, false} {
		if _, err := lr.ReadLine(); err != nil {
			t.Fatal(err)
		}
		if got := lr.HasLine(); got != want {
			t.Errorf("HasLine after line %d = %v, want %v (a partial line is not a line)", i+1, got, want)
		}
	}
}
