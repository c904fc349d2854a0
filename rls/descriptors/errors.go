package descriptors

import (
	"strconv"
	"strings"
)

// Error is one problem of a descriptors file. It names the file, the line,
// the domain and the descriptor, so that an operator can fix it from the
// log line alone.
type Error struct {
	File   string // empty when the contents were given without a name
	Line   int    // 1-based; 0 when the problem has no line
	Domain string // empty before the domain is known
	// Path is the descriptor's place in the file:
	// descriptors[1] (key "remote_address") > descriptors[0].
	Path  string
	Field string // the key at fault within the descriptor, if one is
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File + ":" + strconv.Itoa(e.Line) + ": ")
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	if e.Domain != "" {
		b.WriteString("domain " + strconv.Quote(e.Domain) + ": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found, file by file, in file order. errors.As
// finds each *Error in it.
type Errors []*Error

// Error puts one problem on each line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

func (es Errors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}
