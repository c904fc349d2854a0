package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"quotad/limits"
	"quotad/protocol"
)

// Algorithms a policy may name.
const AlgorithmFixedWindow = "fixed_window"

// Policy modes. A shadow policy computes, consumes and counts like an
// enforced one but always allows, so a new limit can be watched before it
// denies anyone.
const (
	ModeEnforce = "enforce"
	ModeShadow  = "shadow"
)

// DefaultMaxRequestIDs caps the request_id records of one window when a
// policy does not set max_request_ids, and for inline limits.
const DefaultMaxRequestIDs = 10_000

// maxMaxRequestIDs bounds max_request_ids: each record is a hash field, so
// this bounds the memory of one subject's window.
const maxMaxRequestIDs = 1_000_000

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

// fileConfig is the YAML shape of the policy file.
type fileConfig struct {
	Policies map[string]filePolicy `yaml:"policies"`
}

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
}

// intField decodes a YAML integer, refusing floats and strings.
func intField(n yaml.Node) (int64, bool) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		return 0, false
	}
	return v, true
}

// LoadConfig reads and validates the policy file at path. An empty path is
// an empty config (inline limits only).
func LoadConfig(path string) (*Config, error) {
	if path == "" {
		return &Config{Policies: map[string]*Policy{}}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses and validates a policy file's contents. Unknown fields
// are errors, so a typo cannot silently drop a limit.
func ParseConfig(data []byte) (*Config, error) {
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return nil, &ConfigError{Msg: "parse yaml: " + err.Error()}
	}
	cfg := &Config{Policies: make(map[string]*Policy, len(fc.Policies)), source: data}
	for name, fp := range fc.Policies {
		p, err := buildPolicy(name, fp)
		if err != nil {
			return nil, err
		}
		cfg.Policies[name] = p
	}
	return cfg, nil
}

func buildPolicy(name string, fp filePolicy) (*Policy, error) {
	fail := func(field, msg string) error { return &ConfigError{Policy: name, Field: field, Msg: msg} }
	if !protocol.ValidPolicyName(name) {
		return nil, &ConfigError{Policy: name, Msg: "name must be 1 to 64 of A-Z a-z 0-9 _ . -"}
	}
	p := &Policy{Name: name, Algorithm: fp.Algorithm, MaxRequestIDs: DefaultMaxRequestIDs}
	if p.Algorithm == "" {
		p.Algorithm = AlgorithmFixedWindow
	}
	if err := foreignFields(p.Algorithm, fp, fail); err != nil {
		return nil, err
	}
	onUnavailable, err := parseOnUnavailable(fp.OnUnavailable)
	if err != nil {
		return nil, fail("on_unavailable", err.Error())
	}
	p.OnUnavailable = onUnavailable
	switch p.Mode = fp.Mode; p.Mode {
	case "":
		p.Mode = ModeEnforce
	case ModeEnforce, ModeShadow:
	default:
		return nil, fail("mode", "must be enforce or shadow, got "+quote(fp.Mode))
	}
	// The fields every algorithm shares are set; now the algorithm's own.
	switch p.Algorithm {
	case AlgorithmFixedWindow:
	case AlgorithmTokenBucket:
		return buildTokenBucket(p, fp, fail)
	case AlgorithmConcurrency:
		return buildConcurrency(p, fp, fail)
	default:
		return nil, fail("algorithm", "unknown algorithm "+quote(p.Algorithm)+" (supported: fixed_window, token_bucket, concurrency)")
	}
	if fp.Limit.IsZero() {
		return nil, fail("limit", "is required")
	}
	limit, ok := intField(fp.Limit)
	if !ok {
		return nil, fail("limit", "must be an integer, got "+quote(fp.Limit.Value))
	}
	if limit < 1 || limit > protocol.MaxLimit {
		return nil, fail("limit", "must be from 1 to 1000000000, got "+strconv.FormatInt(limit, 10))
	}
	p.Limit = limit
	if fp.Window == "" {
		return nil, fail("window", "is required (a duration such as 1s, 1m, 1h)")
	}
	w, err := time.ParseDuration(fp.Window)
	if err != nil {
		return nil, fail("window", "not a duration: "+quote(fp.Window))
	}
	if w%time.Millisecond != 0 || w < time.Millisecond || w > protocol.MaxWindowMS*time.Millisecond {
		return nil, fail("window", "must be whole milliseconds from 1ms to 744h (31 days), got "+fp.Window)
	}
	p.WindowMS = w.Milliseconds()
	if !fp.MaxRequestIDs.IsZero() {
		n, ok := intField(fp.MaxRequestIDs)
		if !ok || n < 1 || n > maxMaxRequestIDs {
			return nil, fail("max_request_ids", "must be an integer from 1 to 1000000, got "+quote(fp.MaxRequestIDs.Value))
		}
		p.MaxRequestIDs = n
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
	}
	return limits.Window{Limit: p.Limit, WindowMS: p.WindowMS}
}
