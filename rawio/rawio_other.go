//go:build !linux || norawio

package rawio

import (
	"context"
	"crypto/tls"
	"net"
)

// Wrap returns nc: raw system calls are used on Linux only.
func Wrap(nc net.Conn) net.Conn { return nc }

// Dialer returns dial, or a dialer that dials TCP (with TLS when cfg is
// set) as rueidis does, when dial is nil.
func Dialer(dial func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error)) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	if dial != nil {
		return dial
	}
	return func(ctx context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		if cfg != nil {
			return (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, "tcp", dst)
		}
		return d.DialContext(ctx, "tcp", dst)
	}
}
