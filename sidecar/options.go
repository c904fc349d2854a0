package sidecar

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"quotad/dispatch"
)

// Validate refuses options a server cannot run with. It is for options taken
// from a user (NewServer turns zero values into defaults instead), so each
// error names the serve flag that sets the option.
func (o Options) Validate() error {
	if strings.ContainsAny(o.KeyPrefix, "{}") {
		return fmt.Errorf("--key-prefix %q: must not contain { or }, which would put every key in one Redis Cluster slot", o.KeyPrefix)
	}
	if o.RedisTimeout <= 0 {
		return errors.New("--redis-timeout must be positive")
	}
	if o.IdleTimeout < 0 {
		return errors.New("--idle-timeout must be 0 (never) or more")
	}
	if o.MaxConnsPerPeer < 0 {
		return errors.New("--max-conns-per-peer must be 0 (the default) or more")
	}
	return dispatch.ValidateLogDecisions(o.LogDecisions)
}

// ParseSocketMode reads the socket file's permissions for Listen from an
// octal string such as "0660".
func ParseSocketMode(s string) (os.FileMode, error) {
	mode, err := strconv.ParseUint(s, 8, 32)
	if err != nil || mode > 0o777 {
		return 0, fmt.Errorf("--socket-mode %q: want an octal mode such as 0660", s)
	}
	return os.FileMode(mode), nil
}
