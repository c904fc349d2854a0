package descriptors

import (
	"bytes"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"quotad/limits"
)

// The keys each level of a file may hold. envoyproxy/ratelimit accepts its
// keys at any level and ignores those out of place; quotad refuses them
// there, so a shadow_mode written inside rate_limit cannot silently do
// nothing.
var (
	rootKeys       = []string{"domain", "descriptors"}
	descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "metadata"}
	rateLimitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"unit_multiplier", "quotad_policy"}
	replacesKeys = []string{"name"}
)

// metadataBudget bounds the values one descriptor's metadata may expand to,
// so that aliases cannot make a small file decode to a huge one.
const metadataBudget = 10_000

// maxErrors is how many problems of one file are reported: past it, the
// file is not read further.
const maxErrors = 100

// parser reads one file into a domain, collecting every problem.
type parser struct {
	file   string
	domain string
	errs   Errors
	uses   []policyUse
	nodes  int  // descriptors read, every level counted
	full   bool // the file is not read further
	// truncated: more problems than maxErrors; problems says so.
	truncated bool
}

func (p *parser) errorf(n *yaml.Node, path, field, msg string) {
	if p.full {
		return
	}
	if len(p.errs) == maxErrors {
		p.truncated, p.full = true, true
		return
	}
	e := &Error{File: p.file, Domain: p.domain, Path: path, Field: field, Msg: msg}
	if n != nil {
		e.Line = n.Line
	}
	p.errs = append(p.errs, e)
}

// problems returns the file's problems in line order.
func (p *parser) problems() Errors {
	slices.SortStableFunc(p.errs, func(a, b *Error) int { return a.Line - b.Line })
	if p.truncated {
		p.errs = append(p.errs, &Error{File: p.file, Domain: p.domain, Msg: "more problems follow; fix these first"})
	}
	return p.errs
}

// parseFile returns the file's domain, or nil when it has none; problems
// are in p.errs.
func (p *parser) parseFile(data []byte) *domain {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorf(nil, "", "", "the file is empty: it must give a domain")
		} else {
			p.errorf(nil, "", "", "parse yaml: "+err.Error())
		}
		return nil
	}
	var more yaml.Node
	switch err := dec.Decode(&more); {
	case err == nil && !isEmptyDocument(&more):
		p.errorf(&more, "", "", "a second YAML document: a file holds one domain")
	case err != nil && !errors.Is(err, io.EOF):
		p.errorf(nil, "", "", "parse yaml: "+err.Error())
		return nil
	}
	root := resolve(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = resolve(root.Content[0])
	}
	if root.Kind != yaml.MappingNode {
		p.errorf(root, "", "", "the file must be a mapping with domain: and descriptors:")
		return nil
	}
	fields := p.fields(root, "", "", rootKeys)
	if n := fields["domain"]; n == nil || isNull(n) {
		p.errorf(root, "", "domain", "the file must give a domain")
		return nil
	} else if s, ok := p.str(n, "", "domain"); !ok {
		return nil
	} else if s == "" {
		p.errorf(n, "", "domain", "must not be empty")
		return nil
	} else if len(s) > limits.MaxRLSValueBytes {
		p.errorf(n, "", "domain", "longer than "+strconv.Itoa(limits.MaxRLSValueBytes)+" bytes")
		return nil
	} else {
		p.domain = s
	}
	d := &domain{name: p.domain, file: p.file, root: &node{path: p.domain}}
	p.descriptors(d.root, fields["descriptors"], "", 1)
	return d
}

// descriptors reads a descriptors: list into parent's children.
func (p *parser) descriptors(parent *node, list *yaml.Node, path string, depth int) {
	if list == nil || isNull(list) {
		return
	}
	list = resolve(list)
	if list.Kind != yaml.SequenceNode {
		p.errorf(list, path, "descriptors", "must be a list of descriptors")
		return
	}
	if depth > limits.MaxRLSEntries && len(list.Content) > 0 {
		p.errorf(list, path, "descriptors", "nested more than "+strconv.Itoa(limits.MaxRLSEntries)+
			" levels deep: a request descriptor has at most that many entries")
		return
	}
	seen := map[Entry]int{}
	for i, item := range list.Content {
		if p.full {
			return
		}
		p.nodes++
		if p.nodes > limits.MaxRLSConfigDescriptors {
			p.errorf(item, path, "", "more than "+strconv.Itoa(limits.MaxRLSConfigDescriptors)+
				" descriptors in one file (an alias counts every time it is used)")
			p.full = true
			return
		}
		here := "descriptors[" + strconv.Itoa(i) + "]"
		if path != "" {
			here = path + " > " + here
		}
		p.descriptor(parent, resolve(item), here, depth, seen)
	}
}

// descriptor reads one descriptor into parent.
func (p *parser) descriptor(parent *node, item *yaml.Node, path string, depth int, seen map[Entry]int) {
	if item.Kind != yaml.MappingNode {
		p.errorf(item, path, "", "a descriptor must be a mapping with a key:")
		return
	}
	// The key and value name the descriptor in every message about it,
	// so they are looked up before the rest is read.
	var e Entry
	var keyNode, valueNode *yaml.Node
	for i := 0; i+1 < len(item.Content); i += 2 {
		switch k := resolve(item.Content[i]); {
		case k.Kind != yaml.ScalarNode:
		case k.Value == "key" && keyNode == nil:
			keyNode = resolve(item.Content[i+1])
		case k.Value == "value" && valueNode == nil:
			valueNode = resolve(item.Content[i+1])
		}
	}
	if keyNode == nil || isNull(keyNode) {
		p.fields(item, path, "", descriptorKeys)
		p.errorf(item, path, "key", "a descriptor must have a key")
		return
	}
	var ok bool
	if e.Key, ok = p.str(keyNode, path, "key"); !ok {
		return
	}
	if valueNode != nil {
		if e.Value, ok = p.str(valueNode, path, "value"); !ok {
			return
		}
	}
	label := " (key " + quote(e.Key)
	if e.Value != "" {
		label += ", value " + quote(e.Value)
	}
	path += label + ")"
	fields := p.fields(item, path, "", descriptorKeys)
	switch {
	case e.Key == "":
		p.errorf(keyNode, path, "key", "must not be empty")
		return
	case len(e.Key) > limits.MaxRLSKeyBytes:
		p.errorf(keyNode, path, "key", "longer than "+strconv.Itoa(limits.MaxRLSKeyBytes)+" bytes")
		return
	case len(e.Value) > limits.MaxRLSValueBytes:
		p.errorf(valueNode, path, "value", "longer than "+strconv.Itoa(limits.MaxRLSValueBytes)+" bytes")
		return
	}
	if line, dup := seen[e]; dup {
		what := "key " + quote(e.Key) + " without a value"
		if e.Value != "" {
			what = "key " + quote(e.Key) + " with value " + quote(e.Value)
		}
		// Read on, for the problems of its own; it is not added.
		p.errorf(keyNode, path, "", what+" given twice at this level (first at line "+strconv.Itoa(line)+")")
	} else {
		seen[e] = keyNode.Line
	}

	n := &node{key: e.Key, value: e.Value, path: parent.path + "." + e.Key}
	if e.Value != "" {
		n.path += "_" + e.Value
	}
	var flags struct{ shadow, quota, detailed, toMetric, share bool }
	for _, f := range []struct {
		key string
		to  *bool
	}{
		{"shadow_mode", &flags.shadow}, {"quota_mode", &flags.quota}, {"detailed_metric", &flags.detailed},
		{"value_to_metric", &flags.toMetric}, {"share_threshold", &flags.share},
	} {
		if v := fields[f.key]; v != nil {
			*f.to, _ = p.boolean(v, path, f.key)
		}
	}
	wildcard := strings.Contains(e.Value, "*")
	if flags.share && !wildcard {
		p.errorf(fields["share_threshold"], path, "share_threshold", "needs a wildcard value (one with a *)")
	}
	n.valueToMetric = flags.toMetric
	n.shareThreshold = flags.share && wildcard

	var metadata map[string]any
	if m := fields["metadata"]; m != nil && !isNull(m) {
		metadata = p.metadata(m, path)
	}
	if rl := fields["rate_limit"]; rl != nil && !isNull(rl) {
		n.limit = p.rateLimit(resolve(rl), path)
		if n.limit != nil {
			n.limit.ShadowMode = flags.shadow
			n.limit.QuotaMode = flags.quota
			n.limit.DetailedMetric = flags.detailed
			n.limit.ValueToMetric = flags.toMetric
			n.limit.Metadata = metadata
		}
	}
	p.descriptors(n, fields["descriptors"], path, depth+1)
	parent.add(n, wildcard)
}

// rateLimit reads a rate_limit block; nil when it has a problem.
func (p *parser) rateLimit(m *yaml.Node, path string) *RateLimit {
	path += " > rate_limit"
	if m.Kind != yaml.MappingNode {
		p.errorf(m, path, "", "must be a mapping")
		return nil
	}
	before := len(p.errs)
	fields := p.fields(m, path, "", rateLimitKeys)
	rl := &RateLimit{UnitMultiplier: 1}
	if v := fields["name"]; v != nil && !isNull(v) {
		rl.Name, _ = p.str(v, path, "name")
	}
	if v := fields["unlimited"]; v != nil {
		rl.Unlimited, _ = p.boolean(v, path, "unlimited")
	}
	if v := fields["quotad_policy"]; v != nil && !isNull(v) {
		if s, ok := p.str(v, path, "quotad_policy"); ok {
			if !limits.ValidPolicyName(s) {
				p.errorf(v, path, "quotad_policy", "a policy name must be "+limits.PolicyNameChars+", got "+quote(s))
			} else {
				rl.Policy = s
				p.uses = append(p.uses, policyUse{policy: s, err: Error{File: p.file, Line: v.Line, Domain: p.domain, Path: path, Field: "quotad_policy"}})
			}
		}
	}
	unit, hasUnit := fields["unit"], fields["unit"] != nil && !isNull(fields["unit"])
	rpu, hasRPU := fields["requests_per_unit"], fields["requests_per_unit"] != nil && !isNull(fields["requests_per_unit"])
	mult, hasMult := fields["unit_multiplier"], fields["unit_multiplier"] != nil && !isNull(fields["unit_multiplier"])
	switch {
	case rl.Unlimited && rl.Policy != "":
		p.errorf(fields["quotad_policy"], path, "quotad_policy", "not with unlimited: true")
	case rl.Policy != "":
		for _, k := range []string{"unit", "requests_per_unit", "unit_multiplier"} {
			if v := fields[k]; v != nil && !isNull(v) {
				p.errorf(v, path, k, "not with quotad_policy: the policy gives the limit and the window")
			}
		}
	case rl.Unlimited:
		if hasUnit {
			p.errorf(unit, path, "unit", "not with unlimited: true")
		}
		if hasMult {
			p.errorf(mult, path, "unit_multiplier", "not with unlimited: true")
		}
	case !hasUnit:
		p.errorf(m, path, "unit", "required: one of second, minute, hour, day, week, month, year (or unlimited: true)")
	}
	if hasUnit && !rl.Unlimited && rl.Policy == "" {
		if s, ok := p.str(unit, path, "unit"); ok {
			if u, ok := parseUnit(s); ok {
				rl.Unit = u
			} else {
				p.errorf(unit, path, "unit", "unknown unit "+quote(s)+": one of second, minute, hour, day, week, month, year")
			}
		}
	}
	if hasRPU && rl.Policy == "" {
		if n, ok := p.integer(rpu, path, "requests_per_unit", 0, limits.MaxLimit); ok {
			rl.RequestsPerUnit = uint32(n)
		}
	}
	if hasMult && !rl.Unlimited && rl.Policy == "" {
		if n, ok := p.integer(mult, path, "unit_multiplier", 1, limits.MaxRLSUnitMultiplier); ok {
			rl.UnitMultiplier = uint32(n)
		}
	}
	if v := fields["replaces"]; v != nil && !isNull(v) {
		rl.Replaces = p.replaces(resolve(v), path, rl.Name)
	}
	if len(p.errs) > before {
		return nil
	}
	return rl
}

// replaces reads a replaces: list of {name: ...}.
func (p *parser) replaces(list *yaml.Node, path, own string) []string {
	if list.Kind != yaml.SequenceNode {
		p.errorf(list, path, "replaces", "must be a list of {name: ...}")
		return nil
	}
	var names []string
	for i, item := range list.Content {
		item = resolve(item)
		here := "replaces[" + strconv.Itoa(i) + "]"
		if item.Kind != yaml.MappingNode {
			p.errorf(item, path, here, "must be a mapping with a name:")
			continue
		}
		fields := p.fields(item, path, here, replacesKeys)
		var name string
		if v := fields["name"]; v != nil && !isNull(v) {
			var ok bool
			if name, ok = p.str(v, path, here+".name"); !ok {
				continue
			}
		}
		switch {
		case name == "":
			p.errorf(item, path, here, "an empty name: a replaces entry names the rate limit it drops")
		case name == own:
			p.errorf(item, path, here, "names this rate limit itself ("+quote(own)+")")
		default:
			names = append(names, name)
		}
	}
	return names
}

// fields returns a mapping's values by key, reporting keys that are not in
// allowed, keys that are not strings and keys given twice.
func (p *parser) fields(m *yaml.Node, path, within string, allowed []string) map[string]*yaml.Node {
	fields := make(map[string]*yaml.Node, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := resolve(m.Content[i]), m.Content[i+1]
		field := k.Value
		if within != "" {
			field = within + "." + field
		}
		switch {
		case k.Kind != yaml.ScalarNode || k.Tag != "!!str" && k.Tag != "":
			p.errorf(k, path, within, "a key must be a string, got "+describe(k))
		case !contains(allowed, k.Value):
			p.errorf(k, path, within, "unknown key "+quote(k.Value)+hint(k.Value, allowed))
		case fields[k.Value] != nil:
			p.errorf(k, path, field, "given twice (first at line "+strconv.Itoa(fields[k.Value].Line)+")")
		default:
			fields[k.Value] = resolve(v)
		}
	}
	return fields
}

// hint says where a key out of place belongs.
func hint(key string, allowed []string) string {
	switch {
	case key == "<<":
		return ": merge keys are not supported"
	case contains(rateLimitKeys, key) && !contains(allowed, "unit"):
		return ": it belongs inside rate_limit"
	case contains(descriptorKeys, key) && !contains(allowed, "key"):
		return ": it belongs to the descriptor, beside rate_limit"
	case contains(rootKeys, key):
		return ": it belongs at the top of the file"
	}
	return ""
}

// str reads a scalar as its text, as envoyproxy/ratelimit's YAML decoder
// gives a string field (value: 200 is "200").
func (p *parser) str(n *yaml.Node, path, field string) (string, bool) {
	if isNull(n) {
		return "", true
	}
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, field, "must be a string, got "+describe(n))
		return "", false
	}
	return n.Value, true
}

// yaml11Bools are the booleans of YAML 1.1, which envoyproxy/ratelimit's
// decoder (yaml.v2) reads; yaml.v3 reads only true and false.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"true": true, "True": true, "TRUE": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
	"false": false, "False": false, "FALSE": false,
}

func (p *parser) boolean(n *yaml.Node, path, field string) (bool, bool) {
	if isNull(n) {
		return false, true
	}
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!bool" || n.Style == 0) {
		if b, ok := yaml11Bools[n.Value]; ok {
			return b, true
		}
	}
	p.errorf(n, path, field, "must be true or false, got "+describe(n))
	return false, false
}

func (p *parser) integer(n *yaml.Node, path, field string, lo, hi int64) (int64, bool) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil || v < lo || v > hi {
		p.errorf(n, path, field, "must be an integer from "+strconv.FormatInt(lo, 10)+" to "+strconv.FormatInt(hi, 10)+", got "+describe(n))
		return 0, false
	}
	return v, true
}

// metadata decodes a descriptor's metadata to the types structpb.NewStruct
// takes.
func (p *parser) metadata(n *yaml.Node, path string) map[string]any {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "metadata", "must be a mapping")
		return nil
	}
	budget := metadataBudget
	v, err := metadataValue(n, &budget, 0)
	if err != nil {
		p.errorf(n, path, "metadata", err.Error())
		return nil
	}
	return v.(map[string]any)
}

func metadataValue(n *yaml.Node, budget *int, depth int) (any, error) {
	*budget--
	if *budget < 0 || depth > 64 {
		return nil, errors.New("too large or too deep (aliases count every time they are used)")
	}
	n = resolve(n)
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := resolve(n.Content[i])
			if k.Kind != yaml.ScalarNode {
				return nil, errors.New("line " + strconv.Itoa(k.Line) + ": a key must be a scalar, got " + describe(k))
			}
			if k.Value == "<<" && k.Tag == "!!merge" {
				return nil, errors.New("line " + strconv.Itoa(k.Line) + ": merge keys are not supported")
			}
			if _, dup := m[k.Value]; dup {
				return nil, errors.New("line " + strconv.Itoa(k.Line) + ": key " + quote(k.Value) + " given twice")
			}
			v, err := metadataValue(n.Content[i+1], budget, depth+1)
			if err != nil {
				return nil, err
			}
			m[k.Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, len(n.Content))
		for i, c := range n.Content {
			v, err := metadataValue(c, budget, depth+1)
			if err != nil {
				return nil, err
			}
			s[i] = v
		}
		return s, nil
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return nil, nil
		case "!!bool":
			var b bool
			if n.Decode(&b) == nil {
				return b, nil
			}
		case "!!int":
			var i int64
			if n.Decode(&i) == nil {
				return i, nil
			}
			var f float64
			if n.Decode(&f) == nil {
				return f, nil
			}
		case "!!float":
			var f float64
			if n.Decode(&f) == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
				return f, nil
			}
			return nil, errors.New("line " + strconv.Itoa(n.Line) + ": " + quote(n.Value) + " is not a finite number")
		}
		return n.Value, nil
	}
	return nil, errors.New("line " + strconv.Itoa(n.Line) + ": unexpected " + describe(n))
}

// isEmptyDocument reports whether a document holds nothing (a file that
// ends with ---).
func isEmptyDocument(n *yaml.Node) bool {
	return n.Kind == yaml.DocumentNode && (len(n.Content) == 0 || isNull(n.Content[0]))
}

// resolve follows an alias to its anchor.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe names a node's type for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!str" {
			return quote(n.Value)
		}
		return n.Value
	}
	return "an alias"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
