package sidecar

import "quotad/protocol"

// applyShadow turns a take's real verdict into a shadow policy's reply: the
// caller is always allowed, and shadow_allowed carries what an enforced
// policy would have answered. The Redis state is the enforced one: an
// accepted take consumed and recorded its request id as it would under
// enforcement, and a take the limit would have refused wrote nothing. So
// used, remaining and the counts of shadow_denied are what enforcement would
// produce, and switching the policy to enforce continues from the same
// windows.
func (l limits) applyShadow(r protocol.TakeReply) protocol.TakeReply {
	if !l.shadow {
		return r
	}
	r.Shadow, r.ShadowAllowed = true, r.Allowed
	r.Allowed, r.RetryAfterMS = true, 0
	return r
}
