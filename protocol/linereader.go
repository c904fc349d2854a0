package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// LineReader reads '\n'-terminated lines of at most max bytes (the
// terminator and an optional '\r' before it not counted). A longer line is
// discarded up to its newline and reported as ErrTooLarge, so a connection
// survives an oversized request without buffering it.
type LineReader struct {
	br   *bufio.Reader
	max  int
	long []byte // assembles a line that spans more than one buffer fill
	// partial: long holds the start of a line that ErrWouldBlock cut off;
	// discarding: an oversized line is being skipped across ErrWouldBlock.
	partial, discarding bool
}

// ErrWouldBlock is what a non-blocking source returns from Read when it has
// no data for now. ReadLine then returns it too, keeping what it has of the
// current line, and the next ReadLine goes on from there once the source
// has more.
var ErrWouldBlock = errors.New("protocol: no input for now")

// NewLineReader returns a reader of lines of at most max bytes. bufSize is
// the size of the read buffer; lines longer than it are assembled in a
// scratch slice that grows up to max, so idle connections stay small.
func NewLineReader(r io.Reader, bufSize, max int) *LineReader {
	if bufSize < 16 {
		bufSize = 16
	}
	return &LineReader{br: bufio.NewReaderSize(r, bufSize), max: max}
}

// Buffered reports how many bytes are already read from the underlying
// reader and not yet returned.
func (lr *LineReader) Buffered() int { return lr.br.Buffered() }

// HasLine reports whether a whole line is already buffered, so that the
// next ReadLine returns without reading from the underlying reader. A line
// longer than the buffer never counts.
func (lr *LineReader) HasLine() bool {
	b, _ := lr.br.Peek(lr.br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// ReadLine returns the next line without its terminator. The slice is valid
// until the next call. At end of input, a final line without a newline is
// returned as a line; then io.EOF. ErrTooLarge leaves the reader positioned
// after the oversized line (or at end of input).
func (lr *LineReader) ReadLine() ([]byte, error) {
	if lr.discarding {
		return nil, lr.discard()
	}
	if !lr.partial {
		lr.long = lr.long[:0]
	}
	lr.partial = false
	for {
		frag, err := lr.br.ReadSlice('\n')
		switch {
		case err == nil:
			line := frag
			if len(lr.long) > 0 {
				lr.long = append(lr.long, frag...)
				line = lr.long
			}
			return lr.finish(line[:len(line)-1])
		case errors.Is(err, bufio.ErrBufferFull):
			// max+1 leaves room for a '\r' that is not part of the line.
			if len(lr.long)+len(frag) > lr.max+1 {
				return nil, lr.discard()
			}
			lr.long = append(lr.long, frag...)
		case errors.Is(err, ErrWouldBlock):
			if len(lr.long)+len(frag) > lr.max+1 {
				return nil, lr.discard()
			}
			lr.long = append(lr.long, frag...)
			lr.partial = true
			return nil, err
		default:
			if len(frag) == 0 && len(lr.long) == 0 {
				return nil, err
			}
			line := append(lr.long, frag...)
			lr.long = line
			if !errors.Is(err, io.EOF) {
				return nil, err
			}
			return lr.finish(line)
		}
	}
}

func (lr *LineReader) finish(line []byte) ([]byte, error) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	if len(line) > lr.max {
		return nil, ErrTooLarge
	}
	return line, nil
}

// discard skips to the end of the current line. When the source would
// block first, it returns ErrWouldBlock and the next ReadLine goes on
// skipping.
func (lr *LineReader) discard() error {
	lr.long = lr.long[:0]
	lr.discarding = false
	for {
		_, err := lr.br.ReadSlice('\n')
		switch {
		case err == nil:
			return ErrTooLarge
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return ErrTooLarge
		case errors.Is(err, ErrWouldBlock):
			lr.discarding = true
			return err
		default:
			return err
		}
	}
}
