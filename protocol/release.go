package protocol

// ReleaseReply is the answer to a release. Freeing a lease that is not held
// (expired, released before, never taken) is not an error: Released false.
type ReleaseReply struct {
	Released  bool
	Limit     int64
	Used      int64 // live leases left
	Remaining int64
}

// AppendRelease appends the reply line (with its '\n') to dst.
func AppendRelease(dst, id []byte, r ReleaseReply) []byte {
	dst = appendHead(dst, id, true)
	dst = appendBool(dst, `,"released":`, r.Released)
	dst = appendInt(dst, `,"limit":`, r.Limit)
	dst = appendInt(dst, `,"used":`, r.Used)
	dst = appendInt(dst, `,"remaining":`, r.Remaining)
	return append(dst, "}\n"...)
}
