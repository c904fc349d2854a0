//go:build race

package integration_test

// raceEnabled builds the sidecar with the race detector when the tests run
// with it: the server's concurrency lives in that process, not in this one.
const raceEnabled = true
