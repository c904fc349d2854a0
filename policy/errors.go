package policy

// ConfigError is a problem in the policy file; it names the policy and the
// field so that an operator can fix it from the log line alone.
type ConfigError struct {
	Policy string // empty for file-level problems
	Field  string
	Msg    string
}

func (e *ConfigError) Error() string {
	switch {
	case e.Policy != "" && e.Field != "":
		return "policy " + quote(e.Policy) + ": " + e.Field + ": " + e.Msg
	case e.Policy != "":
		return "policy " + quote(e.Policy) + ": " + e.Msg
	default:
		return e.Msg
	}
}

func quote(s string) string { return `"` + s + `"` }
