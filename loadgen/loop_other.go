//go:build !linux

package loadgen

import "context"

// Elsewhere than on Linux each connection has a reader and a writer
// goroutine (loadgen.go).
var useLoop = false

func runLoop(context.Context, *Config) (Result, error) { panic("unreachable") }
