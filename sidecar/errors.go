package sidecar

import "errors"

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("quotad: server closed")
