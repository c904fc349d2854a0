package rls

import (
	"errors"
	"fmt"
)

// ErrInvalid is a request the service refuses as it is (INVALID_ARGUMENT):
// nothing was decided or written.
var ErrInvalid = errors.New("invalid request")

// invalidf is an ErrInvalid naming what is wrong.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
