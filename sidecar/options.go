package sidecar

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// MaxFlushDelay bounds StoreOptions.FlushDelay: a longer wait would add more
// latency to every decision than any batching it buys back.
const MaxFlushDelay = time.Millisecond

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
	return CheckLogDecisions(o.LogDecisions)
}

// Validate refuses store options that cannot work, naming the flag that
// sets each. The URL itself is checked by OpenStore, which parses it.
func (o StoreOptions) Validate() error {
	if o.Timeout < 0 {
		return errors.New("--redis-timeout must be positive")
	}
	if o.FlushDelay < 0 || o.FlushDelay > MaxFlushDelay {
		return fmt.Errorf("--redis-flush-delay must be between 0 and %v", MaxFlushDelay)
	}
	return nil
}

// CheckConfigPoll validates how often a Reloader polls the policy file.
func CheckConfigPoll(d time.Duration) error {
	if d <= 0 {
		return errors.New("--config-poll must be positive")
	}
	return nil
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

// Validate refuses doctor options that cannot work, naming the flag.
func (o DoctorOptions) Validate() error {
	if o.DefaultTTL < time.Millisecond {
		return errors.New("--default-ttl must be at least 1ms")
	}
	return nil
}
