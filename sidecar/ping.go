package sidecar

import (
	"time"

	"quotad/protocol"
)

// ping answers a ping on the connection's reader: the sidecar's own
// state, which needs no decision.
func (s *Server) ping(req *protocol.Request, dst []byte) []byte {
	start := time.Now()
	r := protocol.PingReply{
		Store:   s.store.Kind(),
		RedisOK: s.store.Up(),
		Version: s.opts.Version,
		Ready:   s.ready(s.reqCtx) == nil,
	}
	if err := s.store.LastError(); err != nil {
		r.RedisError = err.Error()
	}
	dst = protocol.AppendPing(dst, req.ID, r)
	s.dispatch.ObservePing(start)
	return dst
}
