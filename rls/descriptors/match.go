package descriptors

import (
	"strconv"
	"strings"
)

// node is one descriptor of the file, with its children indexed for
// Match: exact key and value in a map, wildcards in file order, keys
// without a value in a map.
type node struct {
	key, value string
	path       string // domain.key_value.key, as envoyproxy/ratelimit names stats
	limit      *RateLimit
	// valueToMetric and shareThreshold are the descriptor's flags, which
	// apply at its level even when the limit is deeper.
	valueToMetric  bool
	shareThreshold bool

	exact    map[Entry]*node
	wild     []wildcard
	bare     map[string]*node
	children int
}

// wildcard is a child whose value has a '*', split on it once at load.
type wildcard struct {
	key   string
	parts []string
	node  *node
}

// add puts child under n.
func (n *node) add(child *node, isWildcard bool) {
	n.children++
	if isWildcard {
		n.wild = append(n.wild, wildcard{key: child.key, parts: strings.Split(child.value, "*"), node: child})
	}
	// A wildcard is also found exactly by a request whose value is the
	// pattern itself, before the wildcards are tried, as in
	// envoyproxy/ratelimit.
	switch {
	case child.value == "":
		if n.bare == nil {
			n.bare = map[string]*node{}
		}
		n.bare[child.key] = child
	default:
		if n.exact == nil {
			n.exact = map[Entry]*node{}
		}
		n.exact[Entry{child.key, child.value}] = child
	}
}

// how a level matched.
const (
	byExact = iota + 1
	byWildcard
	byKey
)

// child finds e among n's children: the exact key and value first, then
// the wildcards in file order, then the key alone.
func (n *node) child(e Entry) (*node, int) {
	if c := n.exact[e]; c != nil {
		return c, byExact
	}
	for i := range n.wild {
		if w := &n.wild[i]; w.key == e.Key && wildcardMatch(w.parts, e.Value) {
			return w.node, byWildcard
		}
	}
	if c := n.bare[e.Key]; c != nil {
		return c, byKey
	}
	return nil, 0
}

// wildcardMatch reports whether value matches a pattern split on '*':
// each '*' matches any run of bytes, the empty one too.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

// maxStackEntries is how many entries Match tracks without allocating.
const maxStackEntries = 8

// Match finds the rate limit of one request descriptor of domain, as
// envoyproxy/ratelimit does: entry by entry from the top of the domain's
// descriptors, each level by the exact key and value, then the wildcards
// in file order, then the key alone. Only a descriptor matched at the
// request's last entry gives a limit: a request with more entries than
// the file's path, or fewer, matches nothing. ok is false for an unknown
// domain, no match or a nil Config. Match allocates only the keys it
// returns: Key, and MetricKey when detailed_metric or value_to_metric puts
// request values in it.
func (c *Config) Match(domain string, entries []Entry) (m Match, ok bool) {
	if c == nil {
		return Match{}, false
	}
	d := c.domains[domain]
	if d == nil || len(entries) == 0 {
		return Match{}, false
	}
	// how each entry matched and, for share_threshold wildcards, the
	// pattern that stands for its value; special when a metric key must
	// be built from request values.
	var stack [maxStackEntries]struct {
		how     int
		node    *node
		pattern string
	}
	levels := stack[:0]
	if len(entries) > maxStackEntries {
		levels = make([]struct {
			how     int
			node    *node
			pattern string
		}, 0, len(entries))
	}
	n := d.root
	var found *node
	for i, e := range entries {
		next, how := n.child(e)
		if next == nil {
			return Match{}, false
		}
		level := struct {
			how     int
			node    *node
			pattern string
		}{how, next, ""}
		if how == byWildcard && next.shareThreshold {
			level.pattern = next.value
		}
		levels = append(levels, level)
		if i == len(entries)-1 {
			found = next
			break
		}
		if next.children == 0 {
			return Match{}, false
		}
		n = next
	}
	if found == nil || found.limit == nil {
		return Match{}, false
	}
	m = Match{Limit: found.limit, Path: found.path, MetricKey: found.path}

	size := partSize(domain)
	for i, e := range entries {
		v := e.Value
		if levels[i].pattern != "" {
			v = levels[i].pattern
		}
		size += partSize(e.Key) + partSize(v)
	}
	var b strings.Builder
	b.Grow(size)
	writePart(&b, domain)
	for i, e := range entries {
		writePart(&b, e.Key)
		if levels[i].pattern != "" {
			writePart(&b, levels[i].pattern)
		} else {
			writePart(&b, e.Value)
		}
	}
	m.Key = b.String()

	if found.limit.DetailedMetric {
		m.MetricKey = detailedMetricKey(domain, entries, func(i int) string { return levels[i].pattern })
		return m, true
	}
	runtime := false
	for i, l := range levels {
		if l.pattern == "" && l.node.valueToMetric && (l.how == byWildcard || l.how == byKey && entries[i].Value != "") {
			runtime = true
		}
	}
	if runtime {
		var k strings.Builder
		k.WriteString(domain)
		for i, e := range entries {
			k.WriteString(".")
			k.WriteString(e.Key)
			l := levels[i]
			v := ""
			switch {
			case l.pattern != "":
				v = l.pattern
			case l.how == byExact, l.node.valueToMetric:
				v = e.Value
			case l.how == byWildcard:
				v = l.node.value
			}
			if v != "" {
				k.WriteString("_")
				k.WriteString(v)
			}
		}
		m.MetricKey = k.String()
	}
	return m, true
}

// detailedMetricKey is envoyproxy/ratelimit's key for detailed_metric:
// every entry's key and value as the request gave them, or the pattern of
// a share_threshold wildcard.
func detailedMetricKey(domain string, entries []Entry, pattern func(int) string) string {
	var k strings.Builder
	k.WriteString(domain)
	shared := false
	for i := range entries {
		shared = shared || pattern(i) != ""
	}
	for i, e := range entries {
		k.WriteString(".")
		k.WriteString(e.Key)
		switch p := pattern(i); {
		case p != "":
			k.WriteString("_" + p)
		case shared && e.Value == "":
		default:
			k.WriteString("_" + e.Value)
		}
	}
	return k.String()
}

// partSize is the length writePart writes for s.
func partSize(s string) int {
	n := len(s) + 2
	for l := len(s); l >= 10; l /= 10 {
		n++
	}
	return n
}

// writePart writes s length-prefixed, so no key or value can run into the
// next one.
func writePart(b *strings.Builder, s string) {
	var digits [20]byte
	b.Write(strconv.AppendInt(digits[:0], int64(len(s)), 10))
	b.WriteByte(':')
	b.WriteString(s)
}
