package dispatch

import (
	"strconv"

	"quotad/limits"
	"quotad/protocol"
)

// The RateLimit header fields (draft-ietf-httpapi-ratelimit-headers-11):
// a take or peek that asks for them ("headers":true) gets, as its reply's
// last field, the values an HTTP service copies into its own response:
//
//	RateLimit-Policy: "api";q=100;w=60
//	RateLimit: "api";r=42;t=17
//	Retry-After: 17
//
// Both RateLimit fields are Structured Field Lists (RFC 9651) of one item
// per limit; the item is an sf-string naming the limit, as the draft
// requires: the policy's name, or InlineHeaderName for inline limits.
// Names need no escaping: a policy name is A-Z a-z 0-9 _ . - only.
// Retry-After (RFC 9110 delay-seconds) comes with a denied take only.
//
// What each parameter says, per algorithm, is the algorithm's headerItem;
// an algorithm without one gets genericItem: q the quota, r remaining,
// t the seconds to reset_ms. Seconds are rounded up, so a client that
// waits them finds what was promised.
//
// Shadow and degraded answers describe what the caller is told: a shadow
// policy's take is allowed, so it has no Retry-After, and its r and t are
// the enforced state (what shadow_allowed was decided on); a degraded
// answer (Redis did not decide) has no RateLimit field, since nothing is
// known of the state, and Retry-After when it denies.

// InlineHeaderName names inline limits in the RateLimit header fields.
const InlineHeaderName = "inline"

// headerItem is one limit's member of both RateLimit fields.
type headerItem struct {
	name string
	// RateLimit-Policy: q, and w in seconds (0 omits it), qu ("" omits
	// it: the draft's default unit, requests).
	quota, windowS int64
	unit           string
	// RateLimit: r, and t in seconds when hasReset; no member when
	// unknown (a check that was not asked).
	remaining, resetS int64
	hasReset, unknown bool
}

// headerItemer is implemented by an algorithm whose header fields say more
// than genericItem, or something else.
type headerItemer interface {
	headerItem(shape limits.Shape, o *Outcome) headerItem
}

// genericItem is what every algorithm's decision says: the quota, what
// remains and when it resets.
func genericItem(o *Outcome) headerItem {
	name := o.Policy
	if name == "" {
		name = InlineHeaderName
	}
	return headerItem{
		name: name, quota: o.Limit,
		remaining: max(o.Remaining, 0), resetS: seconds(o.ResetMS), hasReset: true,
	}
}

// itemOf is o's member, from its algorithm.
func itemOf(o *Outcome) headerItem {
	if o.Shape != nil {
		if a, ok := algorithms[o.Shape.Algorithm()].(headerItemer); ok {
			return a.headerItem(o.Shape, o)
		}
	}
	return genericItem(o)
}

// seconds is ms in whole seconds, rounded up.
func seconds(ms int64) int64 { return (max(ms, 0) + 999) / 1000 }

// headerFields renders o's header fields, one list member per check; nil
// when o's request did not ask for them or o is an error. A degraded
// answer has no RateLimit field: nothing is known of the state.
func (o *Outcome) headerFields() *protocol.HeaderFields {
	if !o.Headers || o.Failed() || o.Op == protocol.OpRelease {
		return nil
	}
	var buf [limits.MaxChecks]headerItem
	items := buf[:0]
	for i := range max(len(o.Checks), 1) {
		oc := o.check(i)
		it := itemOf(oc)
		it.unknown = oc.Skipped
		items = append(items, it)
	}
	denied := o.Op == protocol.OpTake && !o.Allowed
	return renderHeaders(items, denied, o.RetryAfterMS, !o.Degraded)
}

// renderHeaders writes the fields of a decision of one or more limits, one
// list member each, in order (in RateLimit, those not unknown). denied
// adds Retry-After, rounded up from retryAfterMS; the draft asks that
// Retry-After not point before the end of a member's t, so a denial's t is
// at most Retry-After. withState false leaves out the RateLimit field.
func renderHeaders(items []headerItem, denied bool, retryAfterMS int64, withState bool) *protocol.HeaderFields {
	var policy, state []byte
	retry := seconds(retryAfterMS)
	for i, it := range items {
		if i > 0 {
			policy = append(policy, ", "...)
		}
		policy = appendSFString(policy, it.name)
		policy = appendParam(policy, ";q=", it.quota)
		if it.unit != "" {
			policy = append(policy, ";qu="...)
			policy = appendSFString(policy, it.unit)
		}
		if it.windowS > 0 {
			policy = appendParam(policy, ";w=", it.windowS)
		}
		if it.unknown {
			continue
		}
		if len(state) > 0 {
			state = append(state, ", "...)
		}
		state = appendSFString(state, it.name)
		state = appendParam(state, ";r=", it.remaining)
		if it.hasReset {
			t := it.resetS
			if denied {
				t = min(t, retry)
			}
			state = appendParam(state, ";t=", t)
		}
	}
	h := &protocol.HeaderFields{Policy: string(policy)}
	if withState {
		h.RateLimit = string(state)
	}
	if denied {
		h.RetryAfter = strconv.FormatInt(retry, 10)
	}
	return h
}

// appendSFString writes s as a Structured Field sf-string (RFC 9651
// section 3.3.3): printable ASCII, with '"' and '\' escaped. Anything else
// cannot be in one and becomes '?'; the names written here never hold any.
func appendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

func appendParam(dst []byte, key string, v int64) []byte {
	return strconv.AppendInt(append(dst, key...), v, 10)
}

// Fixed window: q the limit per w, the window's length; r what is left of
// it and t the seconds until it ends. Before a window opens (a peek of an
// unused subject) t is w: a take now opens a window that long.
func (fixedWindow) headerItem(shape limits.Shape, o *Outcome) headerItem {
	it := genericItem(o)
	it.windowS = seconds(shape.(limits.Window).WindowMS)
	if o.ResetMS <= 0 {
		it.resetS = it.windowS
	}
	return it
}

// Token bucket: q is the burst and w the seconds an empty bucket takes to
// fill, so q per w is the refill rate, the draft's quota per window. r is
// the whole tokens in the bucket and t the seconds until it is full again
// (0 when it is), after which q is available at once; a denial's t is its
// retry after.
func (tokenBucket) headerItem(shape limits.Shape, o *Outcome) headerItem {
	it := genericItem(o)
	it.windowS = seconds(shape.(limits.Bucket).RefillMS())
	return it
}

// Concurrency: q leases of unit concurrent-requests, no window: r is the
// leases free. No t: a lease may be released at any moment, so nothing
// says when more are free; a denial's Retry-After is until the first held
// lease expires unless released.
func (concurrency) headerItem(_ limits.Shape, o *Outcome) headerItem {
	it := genericItem(o)
	it.unit, it.hasReset = "concurrent-requests", false
	return it
}

// Sliding window: q the limit per w, the window's length; r what the
// estimate leaves and t the seconds until the whole current use has slid
// out (reset_ms), 0 when nothing is counted.
func (slidingWindow) headerItem(shape limits.Shape, o *Outcome) headerItem {
	it := genericItem(o)
	it.windowS = seconds(shape.(limits.Sliding).WindowMS)
	return it
}

// HeaderFields are o's RateLimit header fields, as a reply renders them
// (nil unless its request asked for them), for a front end that carries
// them otherwise (rls/, in Envoy's response_headers_to_add).
func (o *Outcome) HeaderFields() *protocol.HeaderFields { return o.headerFields() }
