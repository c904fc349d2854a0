package sidecar

import "errors"

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("quotad: server closed")

// ErrForcedExit is returned by Run when a second signal cut the drain
// short.
var ErrForcedExit = errors.New("forced exit on second signal")
