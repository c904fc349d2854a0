package descriptors

import (
	"slices"
	"testing"
)

// envoyproxy/ratelimit's example configuration (examples/ratelimit/config)
// re-expressed: the fields its service reads for replaces, shadow mode,
// quota mode, unlimited, metadata and detailed metrics.
func TestExampleConfig(t *testing.T) {
	c := mustLoad(t, "testdata/gateway.yaml")
	match := func(entries []Entry) *RateLimit {
		t.Helper()
		m, ok := c.Match("gateway", entries)
		if !ok {
			t.Fatalf("%v: no match", entries)
		}
		return m.Limit
	}
	if l := match(e("tier", "partner")); l.RequestsPerUnit != 4 || !slices.Equal(l.Replaces, []string{"per_tenant", "never_defined"}) {
		t.Errorf("tier=partner: %+v", l)
	}
	if l := match(e("origin", "edge", "upstream", "billing")); !slices.Equal(l.Replaces, []string{"per_tenant"}) {
		t.Errorf("billing: %+v", l)
	}
	if l := match(e("tenant", "t1", "user", "acme")); l.Name != "per_tenant" || l.RequestsPerUnit != 1 {
		t.Errorf("acme: %+v", l)
	}
	if l := match(e("tenant", "t1", "user", "mallory")); l.Name != "blocked" || l.RequestsPerUnit != 0 {
		t.Errorf("mallory: %+v", l)
	}
	if l := match(e("tenant", "t1", "user", "bob")); l.Name != "" || l.RequestsPerUnit != 3 {
		t.Errorf("bob: %+v", l)
	}
	if l := match(e("tenant", "t1")); l.RequestsPerUnit != 2 || l.Unit != UnitMinute {
		t.Errorf("tenant: %+v", l)
	}
	if l := match(e("tenant", "t1", "agent", "trial")); !l.ShadowMode || l.RequestsPerUnit != 3 {
		t.Errorf("trial agent: %+v", l)
	}
	if l := match(e("tenant", "t1", "agent", "curl")); l.ShadowMode || l.Unit != UnitSecond {
		t.Errorf("other agent: %+v", l)
	}
	if l := match(e("tenant", "t1", "probe", "x")); !l.Unlimited {
		t.Errorf("probe: %+v", l)
	}
	if _, ok := c.Match("gateway", e("origin", "edge", "upstream", "other")); ok {
		t.Error("an upstream not in the file matched")
	}
	m, _ := c.Match("gateway", e("session", "s-42"))
	if m.MetricKey != "gateway.session_s-42" || m.Path != "gateway.session" {
		t.Errorf("session: %+v", m)
	}
	if l := match(e("plan", "basic")); !l.QuotaMode || l.Metadata["quota_owner"].(map[string]any)["name"] != "basic" {
		t.Errorf("plan: %+v", l)
	}
}

// The examples of envoyproxy/ratelimit's README, as its text describes them.
func TestReadmeExamples(t *testing.T) {
	// Matching order: the value is tried before the key alone.
	c := mustParse(t, `
domain: per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`)
	checkMatch(t, c, "per_ip", e("remote_address", "50.0.0.1"), &want{rpu: 10, unit: UnitSecond, path: "per_ip.remote_address"})
	checkMatch(t, c, "per_ip", e("remote_address", "50.0.0.5"), &want{rpu: 0, unit: UnitSecond, path: "per_ip.remote_address_50.0.0.5"})

	// A request matches only a descriptor as deep as it is long.
	flat := mustParse(t, "domain: d4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit: {requests_per_unit: 300, unit: second}\n")
	checkMatch(t, flat, "d4", e("key", "value", "subkey", "subvalue"), nil)
	nested := mustParse(t, "domain: d4\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit: {requests_per_unit: 300, unit: second}\n")
	checkMatch(t, nested, "d4", e("key", "value", "subkey", "subvalue"), &want{rpu: 300, unit: UnitSecond, path: "d4.key_value.subkey"})

	// Marketing messages: a nested bare key gives each value its own
	// counter, and the top-level bare key another.
	msg := mustParse(t, `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`)
	a := checkMatch(t, msg, "messaging", e("message_type", "marketing", "to_number", "2061111111"), &want{rpu: 5, unit: UnitDay, path: "messaging.message_type_marketing.to_number"})
	b := checkMatch(t, msg, "messaging", e("message_type", "marketing", "to_number", "2062222222"), &want{rpu: 5, unit: UnitDay, path: "messaging.message_type_marketing.to_number"})
	checkMatch(t, msg, "messaging", e("to_number", "2061111111"), &want{rpu: 100, unit: UnitDay, path: "messaging.to_number"})
	if a.Key == b.Key {
		t.Errorf("two numbers share the counter %q", a.Key)
	}
}
