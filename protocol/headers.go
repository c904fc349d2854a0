package protocol

// HeaderFields are the HTTP header fields a take or peek reply carries when
// its request asked for them ("headers":true): the field values of the IETF
// RateLimit header fields (draft-ietf-httpapi-ratelimit-headers) for the
// decision, ready to be copied into an HTTP response as they are. Package
// dispatch renders them from the decision; here they are only written.
type HeaderFields struct {
	// Policy is the RateLimit-Policy field value.
	Policy string
	// RateLimit is the RateLimit field value; "" omits the member (a
	// degraded answer knows nothing of the state).
	RateLimit string
	// RetryAfter is the Retry-After field value, in delay-seconds; ""
	// omits the member (anything but a denied take).
	RetryAfter string
}

// appendHeaders writes h as the reply's "headers" member, which is always
// the reply's last: {"RateLimit-Policy":...,"RateLimit":...,"Retry-After":...}.
func appendHeaders(dst []byte, h *HeaderFields) []byte {
	if h == nil {
		return dst
	}
	dst = append(dst, `,"headers":{"RateLimit-Policy":`...)
	dst = appendString(dst, h.Policy)
	if h.RateLimit != "" {
		dst = append(dst, `,"RateLimit":`...)
		dst = appendString(dst, h.RateLimit)
	}
	if h.RetryAfter != "" {
		dst = append(dst, `,"Retry-After":`...)
		dst = appendString(dst, h.RetryAfter)
	}
	return append(dst, '}')
}
