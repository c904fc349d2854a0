package policy

import (
	"errors"

	"go.yaml.in/yaml/v3"
)

// What a policy's take answers when Redis cannot decide it (on_unavailable).
const (
	// OnUnavailableError answers UNAVAILABLE: the caller decides.
	OnUnavailableError = "error"
	// OnUnavailableAllow fails open: the take is allowed, marked degraded.
	OnUnavailableAllow = "allow"
	// OnUnavailableDeny fails closed: the take is denied, marked degraded.
	OnUnavailableDeny = "deny"
)

// parseOnUnavailable validates a policy's on_unavailable; absent is the
// default, error.
func parseOnUnavailable(n yaml.Node) (string, error) {
	if n.IsZero() {
		return OnUnavailableError, nil
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		switch n.Value {
		case OnUnavailableError, OnUnavailableAllow, OnUnavailableDeny:
			return n.Value, nil
		}
	}
	return "", errors.New("must be error, allow or deny, got " + quote(n.Value))
}
