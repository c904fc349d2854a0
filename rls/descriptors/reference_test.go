package descriptors

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// refNode is a descriptor as envoyproxy/ratelimit's config_impl.go indexes
// it: children by the joined KEY_VALUE, wildcards as joined patterns in
// file order.
type refNode struct {
	children map[string]*refNode
	wild     []string // joined patterns, file order
	n        *node
}

func refTree(n *node) *refNode {
	r := &refNode{children: map[string]*refNode{}, n: n}
	add := func(c *node) {
		k := c.key
		if c.value != "" {
			k += "_" + c.value
		}
		r.children[k] = refTree(c)
	}
	for _, c := range n.exact {
		add(c)
	}
	for _, c := range n.bare {
		add(c)
	}
	for _, w := range n.wild {
		add(w.node)
		r.wild = append(r.wild, w.key+"_"+w.node.value)
	}
	return r
}

// refGlob matches as the reference's wildcardMatch, on joined text.
func refGlob(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if !strings.HasPrefix(s, parts[0]) || !strings.HasSuffix(s, parts[len(parts)-1]) || len(s) < len(parts[0])+len(parts[len(parts)-1]) {
		return false
	}
	rest := s[len(parts[0]) : len(s)-len(parts[len(parts)-1])]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// refMatch is the reference's GetLimit walk, without overrides: the node
// whose limit applies, or nil; the counter's name as its cache key
// generator writes it (without prefix and window); and the name of its
// stats, detailed_metric and value_to_metric applied.
func refMatch(root *refNode, domain string, entries []Entry) (found *node, key, stats string) {
	cur := root
	shared := map[int]string{}
	detailed := domain
	toMetric := domain
	for i, e := range entries {
		final := e.Key + "_" + e.Value
		detailed += "." + final
		next := cur.children[final]
		wildKey := ""
		if next == nil {
			for _, w := range cur.wild {
				if refGlob(w, final) {
					next, wildKey = cur.children[w], w
					if next.n.shareThreshold {
						shared[i] = strings.TrimPrefix(w, e.Key+"_")
					}
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = cur.children[e.Key]
		}
		toMetric += "."
		if next != nil {
			v := ""
			switch _, share := shared[i]; {
			case wildKey != "" && share:
				v = shared[i]
			case wildKey != "" && next.n.valueToMetric:
				v = e.Value
			case wildKey != "":
				v = strings.TrimPrefix(wildKey, e.Key+"_")
			case byValue, next.n.valueToMetric:
				v = e.Value
			}
			toMetric += e.Key
			if v != "" {
				toMetric += "_" + v
			}
		} else {
			toMetric += e.Key
		}
		if next != nil && next.n.limit != nil && i == len(entries)-1 {
			found = next.n
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		cur = next
	}
	key = domain + "_"
	for i, e := range entries {
		v := e.Value
		if p, ok := shared[i]; ok {
			v = p
		}
		key += e.Key + "_" + v + "_"
	}
	if found == nil {
		return nil, key, ""
	}
	stats = toMetric
	if found.limit.DetailedMetric {
		stats = detailed
		if len(shared) > 0 {
			stats = domain
			for i, e := range entries {
				stats += "." + e.Key
				if p, ok := shared[i]; ok {
					stats += "_" + p
				} else if e.Value != "" {
					stats += "_" + e.Value
				}
			}
		}
	}
	return found, key, stats
}

// wildcards is a domain of wildcards in every arrangement the reference's
// walk tells apart.
const wildcards = `
domain: w
descriptors:
  - {key: k, value: "a*", rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: k, value: "ab*", rate_limit: {unit: second, requests_per_unit: 2}}
  - {key: k, value: "*c", descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 3}}]}
  - {key: k, value: "abc", rate_limit: {unit: second, requests_per_unit: 4}}
  - {key: k, rate_limit: {unit: second, requests_per_unit: 5}, descriptors: [{key: j, value: "a*b*c", rate_limit: {unit: second, requests_per_unit: 6}}]}
  - {key: j, value: "*", descriptors: [{key: k, value: "*", rate_limit: {unit: second, requests_per_unit: 7}}, {key: j}]}
  - {key: v, value_to_metric: true, descriptors: [{key: v, value: "a*", value_to_metric: true, descriptors: [{key: k, detailed_metric: true, rate_limit: {unit: second, requests_per_unit: 11}}, {key: j, rate_limit: {unit: second, requests_per_unit: 12}}]}, {key: k, value: abc, value_to_metric: true, rate_limit: {unit: second, requests_per_unit: 13}}]}
  - {key: s, value: "a*", share_threshold: true, value_to_metric: true, rate_limit: {unit: second, requests_per_unit: 8}, descriptors: [{key: s, value: "*c", share_threshold: true, rate_limit: {unit: second, requests_per_unit: 9}}, {key: k, detailed_metric: true, rate_limit: {unit: second, requests_per_unit: 10}}]}
`

// Match agrees with envoyproxy/ratelimit's walk, and its counters with the
// reference's, on every request whose keys and values hold no '_' (where
// its joined names cannot be confused): many random requests over the keys
// and values of the test files.
func TestMatchAgreesWithReference(t *testing.T) {
	configs := map[string]*Config{
		"shop":    mustLoad(t, "testdata/shop.yaml"),
		"gateway": mustLoad(t, "testdata/gateway.yaml"),
		"w":       mustParse(t, wildcards),
	}
	// The words requests are made of: every key and value of the files, and
	// values the wildcards may or may not match.
	words := map[string][]string{}
	var collect func(d string, n *node)
	collect = func(d string, n *node) {
		children := []*node{}
		for _, c := range n.exact {
			children = append(children, c)
		}
		for _, c := range n.bare {
			children = append(children, c)
		}
		for _, w := range n.wild {
			children = append(children, w.node)
		}
		for _, c := range children {
			words[d+"/keys"] = append(words[d+"/keys"], c.key)
			words[d+"/values"] = append(words[d+"/values"], c.value, strings.ReplaceAll(c.value, "*", ""), strings.ReplaceAll(c.value, "*", "x"))
			collect(d, c)
		}
	}
	for d, c := range configs {
		collect(d, c.domains[d].root)
		words[d+"/values"] = append(words[d+"/values"], "", "zz", "abc", "axbxc", "c")
	}
	// One counter in the reference is one counter here, and two are two.
	keys, refKeys := map[string]string{}, map[string]string{}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	compared, matched := 0, 0
	for d, c := range configs {
		ref := refTree(c.domains[d].root)
		for range 20000 {
			entries := make([]Entry, 1+rng.IntN(3))
			for i := range entries {
				entries[i] = Entry{pick(words[d+"/keys"]), pick(words[d+"/values"])}
			}
			underscore := false
			for _, e := range entries {
				underscore = underscore || strings.Contains(e.Key, "_") || strings.Contains(e.Value, "_")
			}
			if underscore {
				continue
			}
			want, refKey, refStats := refMatch(ref, d, entries)
			m, ok := c.Match(d, entries)
			if ok && m.MetricKey != refStats {
				t.Fatalf("%s %v: metric key %q, the reference's %q", d, entries, m.MetricKey, refStats)
			}
			if ok {
				if k, seen := refKeys[m.Key]; seen && k != refKey {
					t.Fatalf("%s %v: counter %q is the reference's %q and %q", d, entries, m.Key, k, refKey)
				}
				if k, seen := keys[refKey]; seen && k != m.Key {
					t.Fatalf("%s %v: the reference's counter %q is %q and %q", d, entries, refKey, k, m.Key)
				}
				refKeys[m.Key], keys[refKey] = refKey, m.Key
			}
			compared++
			switch {
			case want == nil && ok:
				t.Fatalf("%s %v: matched %s, the reference matches nothing", d, entries, m.Path)
			case want != nil && (!ok || m.Limit != want.limit || m.Path != want.path):
				t.Fatalf("%s %v: got %+v %v, the reference matches %s", d, entries, m, ok, want.path)
			case ok:
				matched++
			}
		}
	}
	t.Logf("compared %d, matched %d", compared, matched)
	if compared < 30000 || matched < 3000 {
		t.Fatalf("compared %d requests, %d matched: too few to say", compared, matched)
	}
}

// FuzzMatchReference holds Match to envoyproxy/ratelimit's walk on request
// descriptors of up to three entries the fuzzer writes.
func FuzzMatchReference(f *testing.F) {
	c, err := Parse("w.yaml", []byte(wildcards))
	if err != nil {
		f.Fatal(err)
	}
	ref := refTree(c.domains["w"].root)
	for _, s := range [][6]string{
		{"k", "abc", "", "", "", ""},
		{"k", "xc", "k", "q", "", ""},
		{"s", "ab", "s", "zc", "", ""},
		{"v", "x", "v", "ab*", "k", "abc"},
		{"j", "", "k", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		entries := []Entry{{k1, v1}}
		if k2 != "" {
			entries = append(entries, Entry{k2, v2})
			if k3 != "" {
				entries = append(entries, Entry{k3, v3})
			}
		}
		for _, e := range entries {
			if strings.Contains(e.Key, "_") || strings.Contains(e.Value, "_") {
				return
			}
		}
		want, _, stats := refMatch(ref, "w", entries)
		m, ok := c.Match("w", entries)
		if (want != nil) != ok || ok && (m.Limit != want.limit || m.MetricKey != stats) {
			t.Fatalf("%v: got %+v %v; the reference: %v %q", entries, m, ok, want, stats)
		}
	})
}
