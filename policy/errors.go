package policy

import (
	"strconv"
	"strings"
)

// ConfigError is a problem in the policy file; it names the file, the line,
// the policy and the field so that an operator can fix it from the log line
// alone.
type ConfigError struct {
	File   string // empty when the contents were given, not a file
	Line   int    // 1-based; 0 when the problem has no line
	Policy string // empty for file-level problems
	Field  string
	Msg    string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File + ":" + strconv.Itoa(e.Line) + ": ")
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	if e.Policy != "" {
		b.WriteString("policy " + quote(e.Policy) + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ConfigErrors is every problem found in one policy file, in file order.
// errors.As finds each *ConfigError in it.
type ConfigErrors []*ConfigError

// Error puts one problem on each line.
func (es ConfigErrors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

func (es ConfigErrors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}

func quote(s string) string { return `"` + s + `"` }
