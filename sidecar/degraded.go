package sidecar

import (
	"bytes"
	"errors"

	"go.yaml.in/yaml/v3"

	"quotad/protocol"
)

// What a policy's take answers when Redis cannot decide it (on_unavailable).
const (
	// OnUnavailableError answers UNAVAILABLE: the caller decides.
	OnUnavailableError = "error"
	// OnUnavailableAllow fails open: the take is allowed, marked degraded.
	OnUnavailableAllow = "allow"
	// OnUnavailableDeny fails closed: the take is denied, marked degraded.
	OnUnavailableDeny = "deny"
)

// parseOnUnavailable validates a policy's on_unavailable; absent is the
// default, error.
func parseOnUnavailable(n yaml.Node) (string, error) {
	if n.IsZero() {
		return OnUnavailableError, nil
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		switch n.Value {
		case OnUnavailableError, OnUnavailableAllow, OnUnavailableDeny:
			return n.Value, nil
		}
	}
	return "", errors.New("must be error, allow or deny, got " + quote(n.Value))
}

// unavailableHead is how every UNAVAILABLE reply line continues after its
// optional id. An id is a JSON string or number, which cannot hold these
// unescaped quotes, so finding it means the code is UNAVAILABLE.
var unavailableHead = []byte(`"ok":false,"error":"` + string(protocol.CodeUnavailable) + `"`)

// appendUndecided answers a take or peek that Redis did not decide. The
// reply is appendFailure's; a take of a policy with on_unavailable allow or
// deny turns an UNAVAILABLE one (whatever its cause: not connected, the
// breaker, a timeout, a refusal) into a take reply marked degraded. The code
// appendFailure chose decides, so the two never disagree on what counts as
// unavailable. The config in force now decides the policy's mode.
func (s *Server) appendUndecided(dst []byte, req *protocol.Request, l limits, err error) []byte {
	n := len(dst)
	dst = s.appendFailure(dst, req, err)
	if req.Op != protocol.OpTake || l.policy == "" || !bytes.Contains(dst[n:], unavailableHead) {
		return dst
	}
	p := s.cfg.Load().Policies[l.policy]
	if p == nil || p.OnUnavailable == OnUnavailableError || p.OnUnavailable == "" {
		return dst
	}
	// Nothing is known of the window: the reply counts nothing as used.
	reply := protocol.TakeReply{Limit: l.limit, Remaining: l.limit, Degraded: true}
	if p.OnUnavailable == OnUnavailableAllow {
		reply.Allowed = true
	} else {
		// The earliest the sidecar may know more: its next probe of Redis.
		reply.RetryAfterMS = max(s.store.ProbeInterval().Milliseconds(), 1)
	}
	// A shadow policy still never refuses: its degraded verdict goes to
	// shadow_allowed like a real one.
	return protocol.AppendTake(dst[:n], req.ID, l.applyShadow(reply))
}
