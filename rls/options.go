package rls

import (
	"errors"
	"os"
)

// Options says where the service listens and what it reads. The service
// is off unless Socket or Addr is set.
type Options struct {
	// Socket is the path of its Unix socket ("" for none); SocketMode its
	// file mode, as the JSON socket's.
	Socket     string
	SocketMode os.FileMode
	// Addr is a TCP host:port ("" for none).
	Addr string
	// Config is the descriptors file or directory (descriptors.Load).
	Config string
	// ResponseHeaders adds the IETF RateLimit-Policy and RateLimit fields
	// of the decision to every response's response_headers_to_add.
	ResponseHeaders bool
}

// Enabled reports whether the service is asked for.
func (o Options) Enabled() bool { return o.Socket != "" || o.Addr != "" }

// Validate refuses options the service cannot run with, naming the serve
// flag that sets each.
func (o Options) Validate() error {
	if !o.Enabled() {
		if o.Config != "" {
			return errors.New("--rls-config needs --rls-socket or --rls-addr")
		}
		if o.ResponseHeaders {
			return errors.New("--rls-response-headers needs --rls-socket or --rls-addr")
		}
		return nil
	}
	if o.Config == "" {
		return errors.New("--rls-config is required with --rls-socket or --rls-addr")
	}
	return nil
}
