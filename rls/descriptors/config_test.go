package descriptors

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"quotad/limits"
)

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return c
}

func mustLoad(t *testing.T, path string) *Config {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return c
}

func e(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{kv[i], kv[i+1]})
	}
	return es
}

// want is what a match must give; a nil want is no match.
type want struct {
	rpu       uint32
	unit      Unit
	name      string
	unlimited bool
	path      string
	metricKey string // Path when empty
}

func checkMatch(t *testing.T, c *Config, domain string, entries []Entry, w *want) Match {
	t.Helper()
	m, ok := c.Match(domain, entries)
	if w == nil {
		if ok {
			t.Errorf("%s %v: matched %s (%+v), want no match", domain, entries, m.Path, *m.Limit)
		}
		return m
	}
	if !ok {
		t.Errorf("%s %v: no match, want %s", domain, entries, w.path)
		return m
	}
	l := m.Limit
	if l.RequestsPerUnit != w.rpu || l.Unit != w.unit || l.Name != w.name || l.Unlimited != w.unlimited {
		t.Errorf("%s %v: got %d per %s name %q unlimited %v, want %d per %s name %q unlimited %v",
			domain, entries, l.RequestsPerUnit, l.Unit, l.Name, l.Unlimited, w.rpu, w.unit, w.name, w.unlimited)
	}
	if m.Path != w.path {
		t.Errorf("%s %v: path %q, want %q", domain, entries, m.Path, w.path)
	}
	mk := w.metricKey
	if mk == "" {
		mk = w.path
	}
	if m.MetricKey != mk {
		t.Errorf("%s %v: metric key %q, want %q", domain, entries, m.MetricKey, mk)
	}
	return m
}

// envoyproxy/ratelimit's TestBasicConfig, on a fixture of quotad's own.
func TestMatchBasic(t *testing.T) {
	c := mustLoad(t, "testdata/shop.yaml")
	if got := c.Domains(); len(got) != 1 || got[0] != "shop" {
		t.Fatalf("domains %q", got)
	}
	for _, tc := range []struct {
		name    string
		domain  string
		entries []Entry
		want    *want
	}{
		{"unknown domain", "nowhere", e("region", "us"), nil},
		{"no entries", "shop", nil, nil},
		{"unknown key", "shop", e("tenant_x", "acme"), nil},
		{"key and value without a limit", "shop", e("tenant", "acme"), nil},
		{"value not in the file, no bare key", "shop", e("tenant", "other"), nil},
		{"more entries than the file's path", "shop", e("region", "eu", "zone", "a"), nil},
		{"first level matches, second level does not", "shop", e("store", "main", "shelf", "bottom"), nil},
		{"bare key at the second level", "shop", e("tenant", "acme", "plan", "free"), &want{rpu: 5, unit: UnitSecond, path: "shop.tenant_acme.plan"}},
		{"value beats bare key at the second level", "shop", e("tenant", "acme", "plan", "gold"), &want{rpu: 50, unit: UnitSecond, path: "shop.tenant_acme.plan_gold"}},
		{"bare key", "shop", e("region", "us"), &want{rpu: 20, unit: UnitMinute, path: "shop.region"}},
		{"value beats bare key", "shop", e("region", "eu"), &want{rpu: 30, unit: UnitMinute, path: "shop.region_eu"}},
		{"value without a limit shadows the bare key", "shop", e("region", "internal"), nil},
		{"no name", "shop", e("client", "c1"), &want{rpu: 1, unit: UnitHour, path: "shop.client"}},
		{"name, unit in capitals", "shop", e("partner", "p1"), &want{rpu: 1, unit: UnitDay, name: "partner_daily", path: "shop.partner"}},
		{"limit at the first level", "shop", e("store", "main"), &want{rpu: 15, unit: UnitDay, path: "shop.store_main"}},
		{"limit at the second level", "shop", e("store", "main", "shelf", "top"), &want{rpu: 25, unit: UnitDay, path: "shop.store_main.shelf_top"}},
		{"unlimited", "shop", e("health", "x"), &want{unlimited: true, path: "shop.health"}},
		{"detailed metric", "shop", e("sku", "a-1"), &want{rpu: 70, unit: UnitMinute, path: "shop.sku", metricKey: "shop.sku_a-1"}},
		{"detailed metric, another value", "shop", e("sku", "b-2"), &want{rpu: 70, unit: UnitMinute, path: "shop.sku", metricKey: "shop.sku_b-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) { checkMatch(t, c, tc.domain, tc.entries, tc.want) })
	}
}

// A counter per runtime value of a bare key; one per value of a wildcard
// without share_threshold; one for every value of a wildcard with it.
func TestMatchKey(t *testing.T) {
	c := mustParse(t, `
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /img/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /doc/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	key := func(entries []Entry) string {
		t.Helper()
		m, ok := c.Match("d", entries)
		if !ok {
			t.Fatalf("%v: no match", entries)
		}
		return m.Key
	}
	if a, b := key(e("ip", "1.1.1.1")), key(e("ip", "2.2.2.2")); a == b {
		t.Errorf("two values of a bare key share the counter %q", a)
	}
	if a, b := key(e("path", "/img/a")), key(e("path", "/img/b")); a == b {
		t.Errorf("two values of a wildcard share the counter %q", a)
	}
	if a, b := key(e("path", "/doc/a")), key(e("path", "/doc/b")); a != b {
		t.Errorf("share_threshold: two values have the counters %q and %q", a, b)
	}
	if got, want := key(e("path", "/doc/a")), "1:d4:path6:/doc/*"; got != want {
		t.Errorf("share_threshold key %q, want %q", got, want)
	}
	// Length prefixes keep keys apart that joined text would not.
	c2 := mustParse(t, `
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	m1, ok1 := c2.Match("d", e("a", "x:1:b", "b", "y"))
	m2, ok2 := c2.Match("d", e("a", "x", "b", "1:b:y"))
	if !ok1 || !ok2 || m1.Key == m2.Key {
		t.Errorf("distinct entries share the key %q (%v %v)", m1.Key, ok1, ok2)
	}
}

// envoyproxy/ratelimit's TestWildcardConfig.
func TestMatchWildcard(t *testing.T) {
	c := mustParse(t, `
domain: w
descriptors:
  - key: trail
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: plain
    value: ab
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: bare
    rate_limit: {unit: minute, requests_per_unit: 22}
  - key: middle
    value: x*z
    rate_limit: {unit: minute, requests_per_unit: 23}
  - key: multi
    value: a*b*c
    rate_limit: {unit: minute, requests_per_unit: 24}
  - key: outer
    value: o1
    descriptors:
      - key: trail
        value: cd*
        rate_limit: {unit: minute, requests_per_unit: 25}
  - key: order
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 26}
  - key: order
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 27}
  - key: order
    value: abc
    rate_limit: {unit: minute, requests_per_unit: 28}
  - key: order
    rate_limit: {unit: minute, requests_per_unit: 29}
`)
	for _, tc := range []struct {
		entries []Entry
		want    *want
	}{
		{e("bare", "v1"), &want{rpu: 22, unit: UnitMinute, path: "w.bare"}},
		{e("trail", "ab1"), &want{rpu: 20, unit: UnitMinute, path: "w.trail_ab*"}},
		{e("trail", "ab"), &want{rpu: 20, unit: UnitMinute, path: "w.trail_ab*"}},
		{e("trail", "a"), nil},
		{e("trail", "xab"), nil},
		{e("plain", "ab1"), nil},
		{e("middle", "xyz"), &want{rpu: 23, unit: UnitMinute, path: "w.middle_x*z"}},
		{e("middle", "x123z"), &want{rpu: 23, unit: UnitMinute, path: "w.middle_x*z"}},
		{e("middle", "xz"), &want{rpu: 23, unit: UnitMinute, path: "w.middle_x*z"}},
		{e("middle", "xy"), nil},
		{e("middle", "axz"), nil},
		{e("multi", "a1b2c"), &want{rpu: 24, unit: UnitMinute, path: "w.multi_a*b*c"}},
		{e("multi", "abc"), &want{rpu: 24, unit: UnitMinute, path: "w.multi_a*b*c"}},
		{e("multi", "a1c"), nil},
		{e("multi", "b1c"), nil},
		{e("multi", "acbc"), &want{rpu: 24, unit: UnitMinute, path: "w.multi_a*b*c"}},
		{e("multi", "abbc"), &want{rpu: 24, unit: UnitMinute, path: "w.multi_a*b*c"}},
		{e("outer", "o1", "trail", "cd9"), &want{rpu: 25, unit: UnitMinute, path: "w.outer_o1.trail_cd*"}},
		{e("outer", "o1", "trail", "ab9"), nil},
		// exact first, then wildcards in file order, then the key alone
		{e("order", "abc"), &want{rpu: 28, unit: UnitMinute, path: "w.order_abc"}},
		{e("order", "abd"), &want{rpu: 26, unit: UnitMinute, path: "w.order_a*"}},
		{e("order", "zz"), &want{rpu: 29, unit: UnitMinute, path: "w.order"}},
	} {
		checkMatch(t, c, "w", tc.entries, tc.want)
	}
}

// envoyproxy/ratelimit's TestShareThreshold: which values share a counter
// and the names their stats get.
func TestShareThreshold(t *testing.T) {
	c := mustParse(t, `
domain: s
descriptors:
  - key: doc
    value: docs/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: org
    value: o1
    descriptors:
      - key: doc
        value: inner/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: doc
    value: top/*
    share_threshold: true
    descriptors:
      - key: doc
        value: inner/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: api
    value: v1/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: verb
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: svc
    value: s/*
    share_threshold: true
    descriptors:
      - key: op
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: dir
    value: d/*
    share_threshold: true
    descriptors:
      - key: file
        value: f/*
        share_threshold: false
        descriptors:
          - key: ext
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: doc
    value: one
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: doc
    value: on*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 51}
  - key: mid
    value: /a*z
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 52}
`)
	for _, tc := range []struct {
		name      string
		a, b      []Entry // share one counter
		path      string
		metricKey string
	}{
		{"top level", e("doc", "docs/a.pdf"), e("doc", "docs/b.csv"), "s.doc_docs/*", ""},
		{"nested", e("org", "o1", "doc", "inner/1"), e("org", "o1", "doc", "inner/2"), "s.org_o1.doc_inner/*", ""},
		{"same key at two levels", e("doc", "top/1", "doc", "inner/1"), e("doc", "top/2", "doc", "inner/2"), "s.doc_top/*.doc_inner/*", ""},
		{"with value_to_metric the pattern is kept", e("api", "v1/x", "verb", "GET"), e("api", "v1/y", "verb", "GET"), "s.api_v1/*.verb", ""},
		{"with detailed_metric below", e("svc", "s/user", "op", "get"), e("svc", "s/order", "op", "get"), "s.svc_s/*.op", "s.svc_s/*.op_get"},
		{"middle wildcard with value_to_metric", e("mid", "/a/z"), e("mid", "/a-b-z"), "s.mid_/a*z", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ma, oka := c.Match("s", tc.a)
			mb, okb := c.Match("s", tc.b)
			if !oka || !okb {
				t.Fatalf("no match: %v %v", oka, okb)
			}
			if ma.Key != mb.Key {
				t.Errorf("keys %q and %q differ", ma.Key, mb.Key)
			}
			if ma.Path != tc.path {
				t.Errorf("path %q, want %q", ma.Path, tc.path)
			}
			mk := tc.metricKey
			if mk == "" {
				mk = tc.path
			}
			if ma.MetricKey != mk || mb.MetricKey != mk {
				t.Errorf("metric keys %q %q, want %q", ma.MetricKey, mb.MetricKey, mk)
			}
		})
	}
	// Not shared below a share_threshold parent when the child does not ask.
	m1, _ := c.Match("s", e("dir", "d/1", "file", "f/1", "ext", "pdf"))
	m2, _ := c.Match("s", e("dir", "d/2", "file", "f/2", "ext", "pdf"))
	if m1.Limit == nil || m1.Key == m2.Key || m1.Path != "s.dir_d/*.file_f/*.ext" {
		t.Errorf("mixed share_threshold: %+v %+v", m1, m2)
	}
	if m3, _ := c.Match("s", e("dir", "d/2", "file", "f/1", "ext", "pdf")); m3.Key != m1.Key {
		t.Errorf("the shared level's value changes the key: %q %q", m1.Key, m3.Key)
	}
	// An exact value beats a share_threshold wildcard and has its own counter.
	one, _ := c.Match("s", e("doc", "one"))
	onx, _ := c.Match("s", e("doc", "onx"))
	if one.Limit == nil || one.Limit.RequestsPerUnit != 50 || onx.Limit == nil || onx.Limit.RequestsPerUnit != 51 || one.Key == onx.Key {
		t.Errorf("exact value and shared wildcard: %+v %+v", one, onx)
	}
	if _, ok := c.Match("s", e("mid", "/a/y")); ok {
		t.Error("/a/y matched /a*z")
	}
}

// envoyproxy/ratelimit's TestDetailedMetric and TestValueToMetric_*: the
// names a match's stats get.
func TestMetricKey(t *testing.T) {
	c := mustParse(t, `
domain: m
descriptors:
  - key: k1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
    descriptors:
      - key: k2
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: n1
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: n2
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value_to_metric: true
        descriptors:
          - key: subject
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject
            rate_limit: {unit: minute, requests_per_unit: 30}
  - key: v1
    descriptors:
      - key: v2
        value_to_metric: true
        descriptors:
          - key: v3
            rate_limit: {unit: second, requests_per_unit: 1}
  - key: plain1
    descriptors:
      - key: plain2
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
  - key: d1
    value_to_metric: true
    descriptors:
      - key: d2
        value_to_metric: true
        descriptors:
          - key: d3
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: last
            rate_limit: {unit: minute, requests_per_unit: 20}
  - key: wv
    value: foo*bar*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
`)
	for _, tc := range []struct {
		entries   []Entry
		path      string
		metricKey string
	}{
		{e("k1", "v"), "m.k1", "m.k1_v"},
		{e("k1", "v", "k2", "w"), "m.k1.k2", "m.k1.k2"},
		{e("n1", "v", "n2", "w"), "m.n1.n2", "m.n1_v.n2_w"},
		{e("route", "draw", "method", "GET", "subject", "123"), "m.route.method.subject", "m.route_draw.method_GET.subject"},
		{e("route", "api", "method", "POST", "subject", "u1"), "m.route.method_POST.subject", "m.route_api.method_POST.subject"},
		{e("route", "", "method", "GET", "subject", "1"), "m.route.method.subject", "m.route.method_GET.subject"},
		{e("route", "draw", "method", "", "subject", "1"), "m.route.method.subject", "m.route_draw.method.subject"},
		{e("route", "", "method", "", "subject", "1"), "m.route.method.subject", "m.route.method.subject"},
		{e("v1", "X", "v2", "Y", "v3", "Z"), "m.v1.v2.v3", "m.v1.v2_Y.v3"},
		{e("plain1", "X", "plain2", "Y"), "m.plain1.plain2", "m.plain1.plain2"},
		{e("user", "alice", "action", "readfile", "resource", "docs"), "m.user.action_read*.resource", "m.user_alice.action_readfile.resource"},
		{e("d1", "draw", "d2", "GET", "d3", "123"), "m.d1.d2.d3", "m.d1_draw.d2_GET.d3_123"},
		{e("wild", "foo1", "other", "bar", "last", "X"), "m.wild_foo*.other.last", "m.wild_foo*.other_bar.last"},
		{e("wv", "foo1bar2"), "m.wv_foo*bar*", "m.wv_foo1bar2"},
	} {
		m, ok := c.Match("m", tc.entries)
		if !ok {
			t.Errorf("%v: no match", tc.entries)
			continue
		}
		if m.Path != tc.path || m.MetricKey != tc.metricKey {
			t.Errorf("%v: path %q metric key %q, want %q %q", tc.entries, m.Path, m.MetricKey, tc.path, tc.metricKey)
		}
	}
}

// envoyproxy/ratelimit's TestMetadata: metadata comes back with the limit,
// ready for structpb.
func TestMetadata(t *testing.T) {
	c := mustParse(t, `
domain: md
descriptors:
  - key: a
    value: "1"
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: first
      - key: b
        value: x
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      quota:
        name: second
        tiers: [1, 2.5, true, null, "s", {k: v}]
        1: int key
        when: 2026-01-02
`)
	m, _ := c.Match("md", e("a", "1", "b", "y"))
	if m.Limit == nil || m.Limit.Metadata["name"] != "first" {
		t.Fatalf("metadata %+v", m.Limit)
	}
	if m, _ := c.Match("md", e("a", "1", "b", "x")); m.Limit == nil || m.Limit.Metadata != nil {
		t.Errorf("a descriptor without metadata has %+v", m.Limit)
	}
	m, _ = c.Match("md", e("c", "z"))
	s, err := structpb.NewStruct(m.Limit.Metadata)
	if err != nil {
		t.Fatalf("structpb: %v", err)
	}
	q := s.GetFields()["quota"].GetStructValue().GetFields()
	if q["name"].GetStringValue() != "second" || q["1"].GetStringValue() != "int key" || q["when"].GetStringValue() != "2026-01-02" {
		t.Errorf("metadata %v", s)
	}
	tiers := q["tiers"].GetListValue().GetValues()
	if len(tiers) != 6 || tiers[0].GetNumberValue() != 1 || tiers[1].GetNumberValue() != 2.5 || !tiers[2].GetBoolValue() ||
		tiers[4].GetStringValue() != "s" || tiers[5].GetStructValue().GetFields()["k"].GetStringValue() != "v" {
		t.Errorf("tiers %v", tiers)
	}
}

func TestUnits(t *testing.T) {
	// The numbers of go-control-plane's RateLimitResponse_RateLimit_Unit.
	for _, tc := range []struct {
		text    string
		unit    Unit
		number  int32
		seconds int64
	}{
		{"second", UnitSecond, 1, 1},
		{"MINUTE", UnitMinute, 2, 60},
		{"Hour", UnitHour, 3, 3600},
		{"day", UnitDay, 4, 86400},
		{"month", UnitMonth, 5, 30 * 86400},
		{"year", UnitYear, 6, 365 * 86400},
		{"wEEk", UnitWeek, 7, 7 * 86400},
	} {
		c := mustParse(t, "domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+tc.text+", requests_per_unit: 1}\n")
		m, ok := c.Match("u", e("k", "v"))
		if !ok || m.Limit.Unit != tc.unit || int32(m.Limit.Unit) != tc.number || tc.unit.Seconds() != tc.seconds {
			t.Errorf("%s: %+v, want %v (%d)", tc.text, m.Limit, tc.unit, tc.number)
		}
		if got := tc.unit.String(); got != strings.ToUpper(tc.text) {
			t.Errorf("%v.String() = %q", tc.unit, got)
		}
	}
	if UnitUnknown.String() != "UNKNOWN" || UnitUnknown.Seconds() != 0 {
		t.Error("UnitUnknown")
	}
}

// Every problem is an *Error naming the file, the line, the domain and the
// descriptor path; envoyproxy/ratelimit's TestEmptyDomain, TestBadLimitUnit,
// TestMisspelledKey and the others, plus quotad's own rules.
func TestParseErrors(t *testing.T) {
	deep := "domain: d\ndescriptors:\n"
	for i := 0; i <= limits.MaxRLSEntries; i++ {
		deep += strings.Repeat("  ", 2*i) + "  - key: k\n" + strings.Repeat("  ", 2*i) + "    descriptors:\n"
	}
	for _, tc := range []struct {
		name string
		yaml string
		want string // the whole message of the first problem
	}{
		{"empty file", "", `test.yaml: the file is empty: it must give a domain`},
		{"bad yaml", "'''\n", `test.yaml: parse yaml: yaml: line 2: found unexpected end of stream`},
		{"not a mapping", "- a\n", `test.yaml:1: the file must be a mapping with domain: and descriptors:`},
		{"no domain", "descriptors: []\n", `test.yaml:1: domain: the file must give a domain`},
		{"empty domain", "domain: ''\n", `test.yaml:1: domain: must not be empty`},
		{"non-string key", "0.25: d\ndescriptors: []\n", `test.yaml:1: a key must be a string, got 0.25`},
		{"list of non-mappings", "domain: d\ndescriptors:\n  - a\n", `test.yaml:3: domain "d": descriptors[0]: a descriptor must be a mapping with a key:`},
		{"misspelled key", "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: day}\n",
			`test.yaml:4: domain "d": descriptors[0] (key "k"): unknown key "ratelimit"`},
		{"misspelled nested key", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
			`test.yaml:7: domain "d": descriptors[0] (key "k", value "v") > rate_limit: unknown key "requestsperunit"`},
		{"empty key", "domain: d\ndescriptors:\n  - key: ''\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
			`test.yaml:3: domain "d": descriptors[0] (key ""): key: must not be empty`},
		{"no key", "domain: d\ndescriptors:\n  - value: v\n", `test.yaml:3: domain "d": descriptors[0]: key: a descriptor must have a key`},
		{"duplicate key and value", "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
			`test.yaml:5: domain "d": descriptors[1] (key "k", value "v"): key "k" with value "v" given twice at this level (first at line 3)`},
		{"duplicate bare key", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: k\n      - key: k\n",
			`test.yaml:6: domain "d": descriptors[0] (key "a") > descriptors[1] (key "k"): key "k" without a value given twice at this level (first at line 5)`},
		{"bad unit", "domain: edge\ndescriptors:\n  - key: a\n  - key: remote_address\n    descriptors:\n      - key: p\n        rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			`test.yaml:7: domain "edge": descriptors[1] (key "remote_address") > descriptors[0] (key "p") > rate_limit: unit: unknown unit "fortnight": one of second, minute, hour, day, week, month, year`},
		{"unknown unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n", `unit: unknown unit "unknown"`},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", `rate_limit: unit: required`},
		{"unlimited with a unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
			`test.yaml:4: domain "d": descriptors[0] (key "k") > rate_limit: unit: not with unlimited: true`},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: n\n      unit: second\n      replaces: [{name: n}]\n",
			`test.yaml:7: domain "d": descriptors[0] (key "k") > rate_limit: replaces[0]: names this rate limit itself ("n")`},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - name: ''\n",
			`replaces[0]: an empty name`},
		{"replaces without name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - {}\n", `replaces[0]: an empty name`},
		{"replaces with another key", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - {name: a, unit: x}\n",
			`replaces[0]: unknown key "unit"`},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", `share_threshold: needs a wildcard value`},
		{"shadow_mode inside rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, shadow_mode: true}\n",
			`unknown key "shadow_mode": it belongs to the descriptor, beside rate_limit`},
		{"unit beside rate_limit", "domain: d\ndescriptors:\n  - key: k\n    unit: second\n", `unknown key "unit": it belongs inside rate_limit`},
		{"key at the top", "domain: d\nkey: k\n", `unknown key "key": it belongs to the descriptor`},
		{"negative requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			`requests_per_unit: must be an integer from 0 to`},
		{"fractional requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2.5}\n", `got 2.5`},
		{"requests_per_unit over the bound", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967295}\n", `got 4294967295`},
		{"not a boolean", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", `shadow_mode: must be true or false, got "maybe"`},
		{"quoted boolean", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: 'true'\n", `shadow_mode: must be true or false`},
		{"unit_multiplier 0", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n",
			`unit_multiplier: must be an integer from 1 to`},
		{"unit_multiplier over the bound", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 1001}\n", `got 1001`},
		{"unit_multiplier with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit_multiplier: 2}\n", `unit_multiplier: not with unlimited`},
		{"quotad_policy with a unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quotad_policy: p, unit: second}\n",
			`unit: not with quotad_policy: the policy gives the limit and the window`},
		{"quotad_policy with requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quotad_policy: p, requests_per_unit: 3}\n", `requests_per_unit: not with quotad_policy`},
		{"quotad_policy with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quotad_policy: p, unlimited: true}\n", `quotad_policy: not with unlimited`},
		{"quotad_policy not a name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quotad_policy: 'a:b'}\n", `quotad_policy: a policy name must be`},
		{"metadata not a mapping", "domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n", `metadata: must be a mapping`},
		{"metadata not finite", "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: .inf}\n", `is not a finite number`},
		{"key given twice in a mapping", "domain: d\ndomain: e\n", `test.yaml:2: domain: given twice (first at line 1)`},
		{"a second document", "domain: d\n---\ndomain: e\n", `a second YAML document: a file holds one domain`},
		{"domain too long", "domain: " + strings.Repeat("d", limits.MaxRLSValueBytes+1) + "\n", `domain: longer than 1024 bytes`},
		{"merge key", "domain: d\nbase: &b {key: k}\ndescriptors:\n  - <<: *b\n", `unknown key "base"`},
		{"too deep", deep, `nested more than 16 levels deep`},
		{"key too long", "domain: d\ndescriptors:\n  - key: " + strings.Repeat("k", limits.MaxRLSKeyBytes+1) + "\n", `key: longer than 256 bytes`},
		{"value too long", "domain: d\ndescriptors:\n  - key: k\n    value: " + strings.Repeat("v", limits.MaxRLSValueBytes+1) + "\n", `value: longer than 1024 bytes`},
		{"descriptors not a list", "domain: d\ndescriptors: {key: k}\n", `descriptors: must be a list of descriptors`},
		{"rate_limit not a mapping", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: 5\n", `rate_limit: must be a mapping`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("test.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("parsed: %v", c.Domains())
			}
			var first *Error
			if !errors.As(err, &first) {
				t.Fatalf("%T %v: not an *Error", err, err)
			}
			if first.File != "test.yaml" {
				t.Errorf("file %q", first.File)
			}
			got := err.Error()
			if !strings.Contains(got, tc.want) {
				t.Errorf("got\n  %s\nwant it to contain\n  %s", got, tc.want)
			}
			if c != nil {
				t.Error("a config came back with the error")
			}
		})
	}
}

// Every problem of a file is reported, not only the first.
func TestParseErrorsAll(t *testing.T) {
	_, err := Parse("f.yaml", []byte(`
domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight}
  - key: b
    rate_limit: {unit: second, requestsperunit: 1}
  - key: c
    shadow_mode: maybe
`))
	var es Errors
	if !errors.As(err, &es) || len(es) != 3 {
		t.Fatalf("got %d problems: %v", len(es), err)
	}
	for i, line := range []int{5, 7, 9} {
		if es[i].Line != line || es[i].Domain != "d" {
			t.Errorf("problem %d: %+v", i, es[i])
		}
	}
}

// What envoyproxy/ratelimit's decoder (yaml.v2) accepts, and a file written
// for it therefore may hold.
func TestParseLenient(t *testing.T) {
	c := mustParse(t, `---
domain: 7
descriptors:
  - key: status
    value: 404
    shadow_mode: yes
    detailed_metric: on
    quota_mode: ~
    metadata: ~
    descriptors: ~
    rate_limit:
      unit: minute
      requests_per_unit: 0
      replaces: []
  - key: empty
    value: ""
    rate_limit: {unit: second}
`)
	m, ok := c.Match("7", e("status", "404"))
	if !ok || !m.Limit.ShadowMode || !m.Limit.DetailedMetric || m.Limit.QuotaMode || m.Limit.RequestsPerUnit != 0 || m.Limit.UnitMultiplier != 1 {
		t.Errorf("%+v %v", m.Limit, ok)
	}
	if _, err := Parse("t.yaml", []byte("domain: d\n---\n")); err != nil {
		t.Errorf("a file ending with ---: %v", err)
	}
	if m, ok := c.Match("7", e("empty", "x")); !ok || m.Path != "7.empty" {
		t.Errorf("value \"\" is a bare key: %+v %v", m, ok)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	one := "domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	write("a.yaml", strings.Replace(one, "%s", "a", 1))
	write("b.yml", strings.Replace(one, "%s", "b", 1))
	write("sub/c.yaml", strings.Replace(one, "%s", "c", 1))
	write("README.md", "not yaml: [")
	write(".hidden.yaml", "not yaml: [")
	write("..data/a.yaml", strings.Replace(one, "%s", "a", 1)) // a ConfigMap's previous contents
	c := mustLoad(t, dir)
	if got := strings.Join(c.Domains(), ","); got != "a,b,c" {
		t.Errorf("domains %s", got)
	}
	// A domain in two files is refused, naming both.
	write("z.yaml", strings.Replace(one, "%s", "b", 1))
	_, err := Load(dir)
	want := filepath.Join(dir, "z.yaml") + `: domain "b": domain given again (first in ` + filepath.Join(dir, "b.yml") + ")"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	if err := os.Remove(filepath.Join(dir, "z.yaml")); err != nil {
		t.Fatal(err)
	}
	// A problem in one file names that file.
	write("sub/c.yaml", "domain: c\nbogus: 1\n")
	_, err = Load(dir)
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 || es[0].File != filepath.Join(dir, "sub", "c.yaml") {
		t.Errorf("got %v", err)
	}
	// An empty directory is a config without domains; a missing path an error.
	if c := mustLoad(t, t.TempDir()); len(c.Domains()) != 0 {
		t.Errorf("domains %q", c.Domains())
	}
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
}

// quotad's extensions: unit_multiplier and quotad_policy.
func TestExtensions(t *testing.T) {
	c := mustParse(t, `
domain: x
descriptors:
  - key: per30s
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 100}
  - key: sliding
    rate_limit: {quotad_policy: api-sliding, name: s}
  - key: bucket
    descriptors:
      - key: user
        rate_limit: {quotad_policy: api-bucket}
      - key: org
        rate_limit: {quotad_policy: api-sliding}
`)
	m, _ := c.Match("x", e("per30s", "a"))
	if m.Limit == nil || m.Limit.Unit != UnitSecond || m.Limit.UnitMultiplier != 30 || m.Limit.RequestsPerUnit != 100 {
		t.Errorf("unit_multiplier: %+v", m.Limit)
	}
	m, _ = c.Match("x", e("sliding", "a"))
	if m.Limit == nil || m.Limit.Policy != "api-sliding" || m.Limit.Unit != UnitUnknown || m.Limit.Name != "s" {
		t.Errorf("quotad_policy: %+v", m.Limit)
	}
	if got := strings.Join(c.Policies(), ","); got != "api-bucket,api-sliding" {
		t.Errorf("policies %s", got)
	}
	if err := c.MissingPolicies(func(string) bool { return true }); err != nil {
		t.Errorf("all exist: %v", err)
	}
	err := c.MissingPolicies(func(name string) bool { return name == "api-bucket" })
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 {
		t.Fatalf("got %v", err)
	}
	for i, want := range []string{
		`test.yaml:7: domain "x": descriptors[1] (key "sliding") > rate_limit: quotad_policy: no policy "api-sliding" in the policy file`,
		`test.yaml:13: domain "x": descriptors[2] (key "bucket") > descriptors[1] (key "org") > rate_limit: quotad_policy: no policy "api-sliding" in the policy file`,
	} {
		if es[i].Error() != want {
			t.Errorf("got\n  %s\nwant\n  %s", es[i], want)
		}
	}
}

// Match runs per request: it allocates the counter key and nothing else.
func TestMatchAllocations(t *testing.T) {
	c := mustLoad(t, "testdata/shop.yaml")
	for _, entries := range [][]Entry{e("tenant", "acme", "plan", "gold"), e("region", "us"), e("tenant", "acme", "plan", "x")} {
		if n := testing.AllocsPerRun(100, func() { c.Match("shop", entries) }); n > 1 {
			t.Errorf("%v: %v allocations per match", entries, n)
		}
	}
	if n := testing.AllocsPerRun(100, func() { c.Match("shop", e("nope", "x")) }); n > 1 { // e's slice
		t.Errorf("no match: %v allocations", n)
	}
}

func BenchmarkMatch(b *testing.B) {
	c, err := Load("testdata/shop.yaml")
	if err != nil {
		b.Fatal(err)
	}
	entries := e("tenant", "acme", "plan", "gold")
	b.ReportAllocs()
	for b.Loop() {
		c.Match("shop", entries)
	}
}

// A file with very many problems reports the first ones in line order and
// says more follow.
func TestParseErrorsTruncated(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := 0; i < 3*maxErrors; i++ {
		b.WriteString("  - key: k" + strconv.Itoa(i) + "\n    rate_limit: {unit: fortnight}\n")
	}
	_, err := Parse("f.yaml", []byte(b.String()))
	var es Errors
	if !errors.As(err, &es) || len(es) != maxErrors+1 {
		t.Fatalf("got %d problems", len(es))
	}
	if es[0].Line != 4 || es[maxErrors-1].Line != 2+2*maxErrors || es[maxErrors].Msg != "more problems follow; fix these first" {
		t.Errorf("first %+v, last %+v %+v", es[0], es[maxErrors-1], es[maxErrors])
	}
}

// Same tells configs built from the same files apart from others.
func TestSame(t *testing.T) {
	a := mustLoad(t, "testdata/shop.yaml")
	b := mustLoad(t, "testdata/shop.yaml")
	c := mustLoad(t, "testdata/gateway.yaml")
	if !a.Same(b) || a.Same(c) || a.Same(nil) {
		t.Errorf("Same: %v %v %v", a.Same(b), a.Same(c), a.Same(nil))
	}
}

// A service without descriptors holds a nil Config: it matches nothing.
func TestNilConfig(t *testing.T) {
	var c *Config
	if _, ok := c.Match("d", e("k", "v")); ok || c.Domains() != nil || c.Policies() != nil {
		t.Error("a nil Config matched or has domains")
	}
}

// A file as deep as the longest request descriptor matches it.
func TestDeepest(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	var entries []Entry
	for i := 0; i < limits.MaxRLSEntries; i++ {
		in := strings.Repeat("    ", i)
		b.WriteString(in + "  - key: k" + strconv.Itoa(i) + "\n")
		if i == limits.MaxRLSEntries-1 {
			b.WriteString(in + "    rate_limit: {unit: second, requests_per_unit: 3}\n" + in + "    descriptors: []\n")
		} else {
			b.WriteString(in + "    descriptors:\n")
		}
		entries = append(entries, Entry{"k" + strconv.Itoa(i), "v"})
	}
	c := mustParse(t, b.String())
	if m, ok := c.Match("d", entries); !ok || m.Limit.RequestsPerUnit != 3 {
		t.Errorf("%d entries: %+v %v", len(entries), m, ok)
	}
}
