package policy

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"quotad/limits"
)

// Policy modes. A shadow policy computes, consumes and counts like an
// enforced one but always allows, so a new limit can be watched before it
// denies anyone.
const (
	ModeEnforce = "enforce"
	ModeShadow  = "shadow"
)

// Messages of the fields out of range; the bounds are package limits'.
var (
	limitRange    = "must be an integer from 1 to " + strconv.Itoa(limits.MaxLimit) + ", got "
	durationRange = "must be whole milliseconds from 1ms to " + limits.MaxWindowText + ", got "
	maxIDsRange   = "must be an integer from 1 to " + strconv.Itoa(limits.MaxRequestIDs) + ", got "
)

// Policy is one named limit from the config file.
type Policy struct {
	Name          string
	Algorithm     string
	Limit         int64
	WindowMS      int64
	MaxRequestIDs int64
	// OnUnavailable is what a take answers when Redis cannot decide it:
	// OnUnavailableError (the default), OnUnavailableAllow or
	// OnUnavailableDeny.
	OnUnavailable string
	// Fields of the other algorithms (config_algorithms.go); Limit is also
	// the concurrency limit.
	Rate     int64
	PeriodMS int64
	Burst    int64
	DedupeMS int64
	LeaseMS  int64
	Mode     string // ModeEnforce or ModeShadow
	// A calendar window (calendar.go): Limit per Period of TimeZone.
	Period    string
	TimeZone  string
	WeekStart time.Weekday
	JitterMS  int64
	// Allotment lets a sidecar answer takes from units it reserved in
	// Redis (docs/allotments.md); nil when the policy has none.
	Allotment *limits.Allotment
}

// Config is a parsed and validated policy file. It is immutable once built;
// a reload builds a new one.
type Config struct {
	Policies map[string]*Policy
	source   []byte // the file's contents, so a reloader notices changes after it
}

// Names returns the policy names in order, for logs.
func (c *Config) Names() []string {
	names := make([]string, 0, len(c.Policies))
	for n := range c.Policies {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// filePolicy is the YAML shape of one policy; the file is a mapping under
// the one top-level key policies:.
type filePolicy struct {
	Algorithm string `yaml:"algorithm"`
	// Integers are decoded by hand: yaml.v3 would truncate 2.9 to 2.
	Limit         yaml.Node `yaml:"limit"`
	Window        string    `yaml:"window"`
	MaxRequestIDs yaml.Node `yaml:"max_request_ids"`
	OnUnavailable yaml.Node `yaml:"on_unavailable"`
	Rate          yaml.Node `yaml:"rate"`
	Period        string    `yaml:"period"`
	Burst         yaml.Node `yaml:"burst"`
	Dedupe        string    `yaml:"dedupe"`
	Lease         string    `yaml:"lease"`
	Mode          string    `yaml:"mode"`
	TimeZone      string    `yaml:"time_zone"`
	WeekStart     string    `yaml:"week_start"`
	Jitter        string    `yaml:"jitter"`
	Allotment     yaml.Node `yaml:"allotment"`
}

// intField decodes a YAML integer, refusing floats and strings.
func intField(n yaml.Node) (int64, bool) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		return 0, false
	}
	return v, true
}

// NoPoliciesWarning is logged, and printed by `quotad check`, for a policy
// file that defines no policy: valid, since inline limits need none, but
// more often an emptied ConfigMap or a misplaced key, and with
// --allow-inline=false every request would be refused.
const NoPoliciesWarning = "the policy file defines no policies: only inline limits can be taken"

// LoadConfig reads and validates the policy file at path. An empty path is
// an empty config (inline limits only). A file with problems returns
// ConfigErrors, each naming the file.
func LoadConfig(path string) (*Config, error) {
	if path == "" {
		return &Config{Policies: map[string]*Policy{}}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := ParseConfig(data)
	var errs ConfigErrors
	if errors.As(err, &errs) {
		for _, e := range errs {
			e.File = path
		}
	}
	return cfg, err
}

// ParseConfig parses and validates a policy file's contents. Unknown keys
// are errors, so a typo cannot silently drop a limit. Every policy is
// checked: the error is ConfigErrors, the problems in file order.
func ParseConfig(data []byte) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, ConfigErrors{{Msg: "parse yaml: " + err.Error()}}
	}
	cfg := &Config{Policies: map[string]*Policy{}, source: data}
	var errs ConfigErrors
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	switch {
	case root.Kind == 0 || isNull(root):
		return cfg, nil
	case root.Kind != yaml.MappingNode:
		return nil, ConfigErrors{{Line: root.Line, Msg: "the file must be a mapping with a policies: key"}}
	}
	var policies *yaml.Node
	policiesLine := 0
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch {
		case k.Value != "policies":
			errs = append(errs, &ConfigError{Line: k.Line, Msg: "unknown top-level key " + quote(k.Value) + didYouMean(k.Value, topLevelKeys)})
		case policies != nil:
			errs = append(errs, &ConfigError{Line: k.Line, Msg: "policies: given twice (first at line " + strconv.Itoa(policiesLine) + ")"})
		default:
			policies, policiesLine = resolveAlias(v), k.Line
		}
	}
	if policies != nil && !isNull(policies) && policies.Kind != yaml.MappingNode {
		errs = append(errs, &ConfigError{Line: policies.Line, Msg: "policies: must be a mapping of policy names to policies"})
		policies = nil
	}
	firstLine := map[string]int{}
	for i := 0; policies != nil && i+1 < len(policies.Content); i += 2 {
		k, v := policies.Content[i], policies.Content[i+1]
		name := k.Value
		if line, dup := firstLine[name]; dup {
			errs = append(errs, &ConfigError{Line: k.Line, Policy: name, Msg: "defined twice (first at line " + strconv.Itoa(line) + ")"})
			continue
		}
		firstLine[name] = k.Line
		fp, lines, perrs := decodePolicy(name, k, v)
		if len(perrs) > 0 {
			errs = append(errs, perrs...)
			continue
		}
		p, err := buildPolicy(name, fp)
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) {
				ce = &ConfigError{Policy: name, Msg: err.Error()}
			}
			ce.Line = k.Line
			if l, ok := lines[ce.Field]; ok {
				ce.Line = l
			}
			errs = append(errs, ce)
			continue
		}
		cfg.Policies[name] = p
	}
	if len(errs) > 0 {
		slices.SortStableFunc(errs, func(a, b *ConfigError) int { return a.Line - b.Line })
		return nil, errs
	}
	return cfg, nil
}

// topLevelKeys are the keys a policy file may hold.
var topLevelKeys = []string{"policies"}

// policyFields are the keys a policy may hold, from filePolicy's tags, in
// order.
var policyFields = func() []string {
	t := reflect.TypeFor[filePolicy]()
	names := make([]string, t.NumField())
	for i := range names {
		names[i] = t.Field(i).Tag.Get("yaml")
	}
	return names
}()

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// decodePolicy decodes one policy's mapping field by field, so that every
// unknown or malformed field is reported with its line; lines maps each
// field given to the line of its value.
func decodePolicy(name string, k, v *yaml.Node) (fp filePolicy, lines map[string]int, errs ConfigErrors) {
	lines = map[string]int{}
	v = resolveAlias(v)
	if isNull(v) {
		return fp, lines, nil
	}
	if v.Kind != yaml.MappingNode {
		return fp, lines, ConfigErrors{{Line: k.Line, Policy: name, Msg: "must be a mapping of fields such as limit: and window:"}}
	}
	dst := reflect.ValueOf(&fp).Elem()
	for _, pair := range mappingPairs(v) {
		fk, fv := pair[0], pair[1]
		field := slices.Index(policyFields, fk.Value)
		switch {
		case field < 0:
			errs = append(errs, &ConfigError{Line: fk.Line, Policy: name, Msg: "unknown field " + quote(fk.Value) + didYouMean(fk.Value, policyFields)})
			continue
		case lines[fk.Value] != 0:
			errs = append(errs, &ConfigError{Line: fk.Line, Policy: name, Field: fk.Value, Msg: "given twice"})
			continue
		}
		lines[fk.Value] = fv.Line
		if err := fv.Decode(dst.Field(field).Addr().Interface()); err != nil {
			errs = append(errs, &ConfigError{Line: fv.Line, Policy: name, Field: fk.Value, Msg: "must be a single value, got a " + kindName(fv)})
		}
	}
	return fp, lines, errs
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// mappingPairs lists a mapping's key/value pairs with YAML merge keys
// (<<: *base) expanded: a merged field is left out where the mapping sets
// it itself, as YAML says.
func mappingPairs(m *yaml.Node) [][2]*yaml.Node {
	var own, merged [][2]*yaml.Node
	set := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], resolveAlias(m.Content[i+1])
		if k.Tag != "!!merge" {
			own = append(own, [2]*yaml.Node{k, v})
			set[k.Value] = true
			continue
		}
		sources := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			sources = v.Content
		}
		for _, src := range sources {
			if src = resolveAlias(src); src.Kind == yaml.MappingNode {
				merged = append(merged, mappingPairs(src)...)
			}
		}
	}
	for _, p := range merged {
		if !set[p[0].Value] {
			own = append(own, p)
			set[p[0].Value] = true
		}
	}
	return own
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "mapping"
	}
	return n.Tag
}

// didYouMean suggests the valid name closest to a mistyped one, or says
// nothing when none is close: at most two edits, fewer than its length.
func didYouMean(got string, valid []string) string {
	best, bestDist := "", 3
	for _, v := range valid {
		if d := editDistance(strings.ToLower(got), v); d < bestDist && d < len(got) {
			best, bestDist = v, d
		}
	}
	if best == "" {
		return ""
	}
	return " (did you mean " + quote(best) + "?)"
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and swaps of neighbours each count one, so
// "windwo" is one edit from "window".
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// d[i][j] is the distance between ra[:i] and rb[:j].
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

func buildPolicy(name string, fp filePolicy) (*Policy, error) {
	fail := func(field, msg string) error { return &ConfigError{Policy: name, Field: field, Msg: msg} }
	if !limits.ValidPolicyName(name) {
		return nil, &ConfigError{Policy: name, Msg: "name must be " + limits.PolicyNameChars}
	}
	p := &Policy{Name: name, Algorithm: fp.Algorithm, MaxRequestIDs: limits.DefaultMaxRequestIDs}
	if p.Algorithm == "" {
		p.Algorithm = limits.FixedWindow
	}
	if err := foreignFields(p.Algorithm, fp, fail); err != nil {
		return nil, err
	}
	onUnavailable, err := parseOnUnavailable(fp.OnUnavailable)
	if err != nil {
		return nil, fail("on_unavailable", err.Error())
	}
	p.OnUnavailable = onUnavailable
	if p.Allotment, err = readAllotment(p.Algorithm, fp.Allotment, fail); err != nil {
		return nil, err
	}
	switch p.Mode = fp.Mode; p.Mode {
	case "":
		p.Mode = ModeEnforce
	case ModeEnforce, ModeShadow:
	default:
		return nil, fail("mode", "must be enforce or shadow, got "+quote(fp.Mode))
	}
	// The fields every algorithm shares are set; now the algorithm's own.
	switch p.Algorithm {
	case limits.FixedWindow:
	case limits.TokenBucket:
		return buildTokenBucket(p, fp, fail)
	case limits.Concurrency:
		return buildConcurrency(p, fp, fail)
	case limits.SlidingWindow:
		// limit, window and max_request_ids, read below as for the fixed
		// window.
	case limits.Calendar:
		return buildCalendar(p, fp, fail)
	default:
		return nil, fail("algorithm", "unknown algorithm "+quote(p.Algorithm)+" (supported: fixed_window, token_bucket, concurrency, sliding_window, calendar)")
	}
	if fp.Limit.IsZero() {
		return nil, fail("limit", "is required")
	}
	limit, ok := intField(fp.Limit)
	if !ok {
		return nil, fail("limit", "must be an integer, got "+quote(fp.Limit.Value))
	}
	if limit < 1 || limit > limits.MaxLimit {
		return nil, fail("limit", "must be from 1 to "+strconv.Itoa(limits.MaxLimit)+", got "+strconv.FormatInt(limit, 10))
	}
	p.Limit = limit
	if fp.Window == "" {
		return nil, fail("window", "is required (a duration such as 1s, 1m, 1h)")
	}
	w, err := time.ParseDuration(fp.Window)
	if err != nil {
		return nil, fail("window", "not a duration: "+quote(fp.Window))
	}
	if w%time.Millisecond != 0 || w < time.Millisecond || w > limits.MaxWindow {
		return nil, fail("window", durationRange+fp.Window)
	}
	p.WindowMS = w.Milliseconds()
	if err := readMaxRequestIDs(p, fp, fail); err != nil {
		return nil, err
	}
	return p, nil
}

// Shape is the policy's limit as its algorithm reads it.
func (p *Policy) Shape() limits.Shape {
	switch p.Algorithm {
	case limits.TokenBucket:
		return limits.Bucket{Rate: p.Rate, PeriodMS: p.PeriodMS, Burst: p.Burst}
	case limits.Concurrency:
		return limits.Leases{Limit: p.Limit, LeaseMS: p.LeaseMS}
	case limits.SlidingWindow:
		return limits.Sliding{Limit: p.Limit, WindowMS: p.WindowMS}
	case limits.Calendar:
		return p.calendar()
	}
	return limits.Window{Limit: p.Limit, WindowMS: p.WindowMS}
}
