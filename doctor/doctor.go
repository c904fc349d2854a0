package doctor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"quotad/limits"
	"quotad/luascript"

	"github.com/redis/rueidis"
)

// DefaultTTL is the TTL `quotad doctor --fix` gives a key without one
// when the key does not record its own window length.
const DefaultTTL = 24 * time.Hour

// Options configures Run.
type Options struct {
	// KeyPrefix is the sidecars' --key-prefix; only keys under it are read.
	KeyPrefix string
	// Fix restores a missing TTL. Nothing else is ever written.
	Fix bool
	// DefaultTTL is the TTL restored on a key whose hash does not hold its
	// window length. Zero means DefaultTTL.
	DefaultTTL time.Duration
	// Top is how many of the largest request-id sets to report; zero means 10.
	Top int
	// ScanCount is the COUNT hint of each SCAN; zero means 1000.
	ScanCount int64
}

// Report is what Run found. Its JSON form is the output of
// `quotad doctor --json`.
type Report struct {
	Prefix    string        `json:"prefix"`
	Keys      int64         `json:"keys"`
	Policies  []PolicyKeys  `json:"policies"`
	NoTTL     []NoTTLKey    `json:"no_ttl"`
	WrongType []WrongType   `json:"wrong_type"`
	Largest   []RequestIDOf `json:"largest_request_id_sets"`
	// Reservations counts the allotment records (a:<holder>, see
	// docs/allotments.md): units a sidecar reserved and has not given
	// back, part of the state, never a problem.
	Reservations int64 `json:"reservations"`
	// Problems is len(NoTTL) + len(WrongType), fixed or not: a key that had
	// lost its TTL is an incident worth a look even once repaired.
	Problems int `json:"problems"`
}

// PolicyKeys counts the keys of one policy and algorithm. Policy is "" for
// inline limits, and Inline says so; keys whose name quotad would not write
// are counted under Policy "" with Other set.
type PolicyKeys struct {
	Algorithm string `json:"algorithm"`
	Policy    string `json:"policy"`
	Inline    bool   `json:"inline,omitempty"`
	Other     bool   `json:"other,omitempty"`
	Keys      int64  `json:"keys"`
}

// NoTTLKey is a key that would live forever. With --fix, Fixed says that
// its TTL was restored, to TTLMS; Meanwhile that a sidecar gave it one
// between the scan and the fix.
type NoTTLKey struct {
	Key       string `json:"key"`
	Algorithm string `json:"algorithm"`
	Fixed     bool   `json:"fixed"`
	TTLMS     int64  `json:"ttl_ms,omitempty"`
	Meanwhile bool   `json:"ttl_set_meanwhile,omitempty"`
}

// WrongType is a key under the prefix that is not a hash, so not a quotad
// window; it is never touched.
type WrongType struct {
	Key  string `json:"key"`
	Type string `json:"type"`
}

// RequestIDOf is the size of one window's request-id records.
type RequestIDOf struct {
	Key        string `json:"key"`
	RequestIDs int64  `json:"request_ids"`
	Fields     int64  `json:"fields"`
}

// parseKey splits a key (without the prefix) into algorithm and policy,
// by the algorithms' key layouts (luascript.Layouts).
func parseKey(rest string) (pk PolicyKeys) {
	alg, tag, ok := strings.Cut(rest, ":")
	pk.Algorithm = "unknown"
	if l, known := luascript.LayoutOf(alg); known {
		pk.Algorithm = l.Algorithm
	}
	switch {
	case !ok:
		pk.Other = true
	case strings.HasPrefix(tag, "{i:"), strings.HasPrefix(tag, "i:"):
		// The second form: a subject with its own hash tag (luascript/key.go).
		pk.Inline = true
	case strings.HasPrefix(tag, "{p:"), strings.HasPrefix(tag, "p:"):
		name, _, found := strings.Cut(strings.TrimPrefix(tag, "{")[len("p:"):], ":")
		if found && name != "" {
			pk.Policy = name
		} else {
			pk.Other = true
		}
	default:
		pk.Other = true
	}
	return pk
}

// Run scans every key under opts.KeyPrefix with SCAN (never KEYS, which
// would block Redis) on every primary, and reports keys without a TTL, keys
// of the wrong type, the largest request-id sets and the keys per policy.
// With opts.Fix it restores missing TTLs (PEXPIRE ... NX, so a TTL set
// meanwhile by a sidecar is kept).
func Run(ctx context.Context, c rueidis.Client, opts Options) (*Report, error) {
	if opts.DefaultTTL <= 0 {
		opts.DefaultTTL = DefaultTTL
	}
	if opts.Top <= 0 {
		opts.Top = 10
	}
	if opts.ScanCount <= 0 {
		opts.ScanCount = 1000
	}
	nodes, err := primaries(ctx, c)
	if err != nil {
		return nil, err
	}
	d := &doctor{opts: opts, r: &Report{Prefix: opts.KeyPrefix}, counts: map[PolicyKeys]int64{}}
	for _, n := range nodes {
		if err := d.scan(ctx, n); err != nil {
			return nil, err
		}
	}
	for pk, n := range d.counts {
		pk.Keys = n
		d.r.Policies = append(d.r.Policies, pk)
	}
	slices.SortFunc(d.r.Policies, func(a, b PolicyKeys) int {
		return cmp.Or(cmp.Compare(b.Keys, a.Keys), cmp.Compare(a.Algorithm, b.Algorithm), cmp.Compare(a.Policy, b.Policy),
			cmp.Compare(fmt.Sprint(a.Inline), fmt.Sprint(b.Inline)))
	})
	slices.SortFunc(d.r.NoTTL, func(a, b NoTTLKey) int { return cmp.Compare(a.Key, b.Key) })
	slices.SortFunc(d.r.WrongType, func(a, b WrongType) int { return cmp.Compare(a.Key, b.Key) })
	d.r.Problems = len(d.r.NoTTL) + len(d.r.WrongType)
	return d.r, nil
}

type doctor struct {
	opts   Options
	r      *Report
	counts map[PolicyKeys]int64
}

// primaries are the nodes to scan: the one Redis, or each cluster primary
// (a replica holds the same keys and refuses the fix).
func primaries(ctx context.Context, c rueidis.Client) ([]rueidis.Client, error) {
	var out []rueidis.Client
	for addr, n := range c.Nodes() {
		if c.Mode() == rueidis.ClientModeCluster {
			role, err := n.Do(ctx, n.B().Role().Build()).ToArray()
			if err != nil || len(role) == 0 {
				return nil, fmt.Errorf("role of %s: %v", addr, err)
			}
			if r, _ := role[0].ToString(); r != "master" {
				continue
			}
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no redis node to scan")
	}
	return out, nil
}

// globEscape makes the prefix literal in a SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (d *doctor) scan(ctx context.Context, n rueidis.Client) error {
	match := globEscape(d.opts.KeyPrefix) + "*"
	var cursor uint64
	for {
		e, err := n.Do(ctx, n.B().Scan().Cursor(cursor).Match(match).Count(d.opts.ScanCount).Build()).AsScanEntry()
		if err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		if err := d.inspect(ctx, n, e.Elements); err != nil {
			return err
		}
		if cursor = e.Cursor; cursor == 0 {
			return nil
		}
	}
}

// inspect reads the type, TTL and size of one SCAN page's keys in one
// round trip.
func (d *doctor) inspect(ctx context.Context, n rueidis.Client, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	cmds := make(rueidis.Commands, 0, 3*len(keys))
	for _, k := range keys {
		cmds = append(cmds, n.B().Type().Key(k).Build(), n.B().Pttl().Key(k).Build(), n.B().Hlen().Key(k).Build())
	}
	res := n.DoMulti(ctx, cmds...)
	for i, k := range keys {
		typ, err := res[3*i].ToString()
		if err != nil {
			return fmt.Errorf("type %s: %w", k, err)
		}
		pttl, err := res[3*i+1].AsInt64()
		if err != nil {
			return fmt.Errorf("pttl %s: %w", k, err)
		}
		if typ == "none" || pttl == -2 {
			continue // expired between SCAN and now
		}
		pk := parseKey(strings.TrimPrefix(k, d.opts.KeyPrefix))
		d.r.Keys++
		d.counts[pk]++
		if typ != "hash" {
			d.r.WrongType = append(d.r.WrongType, WrongType{Key: k, Type: typ})
			continue
		}
		if pttl == -1 {
			nt, err := d.noTTL(ctx, n, k, pk.Algorithm)
			if err != nil {
				return err
			}
			d.r.NoTTL = append(d.r.NoTTL, nt)
		}
		fields, _ := res[3*i+2].AsInt64()
		// A hash no larger than its algorithm's fixed fields holds no
		// request-id record to count.
		if l, ok := layoutByAlgorithm(pk.Algorithm); ok && l.IDMatch != "" && fields > l.Fixed {
			if err := d.requestIDs(ctx, n, k, l.IDMatch, fields); err != nil {
				return err
			}
		}
	}
	return nil
}

// noTTL reports a key without a TTL and, with Fix, gives it one: the
// key's own length when its hash records it (the layout's WindowField,
// "<limit>:<window_ms>"), until its period's end for a calendar window
// (calendar.go), else DefaultTTL.
func (d *doctor) noTTL(ctx context.Context, n rueidis.Client, key, alg string) (NoTTLKey, error) {
	nt := NoTTLKey{Key: key, Algorithm: alg}
	if !d.opts.Fix {
		return nt, nil
	}
	ttl := d.opts.DefaultTTL.Milliseconds()
	if l, ok := layoutByAlgorithm(alg); ok && l.WindowField != "" {
		if ms, ok := windowOf(ctx, n, key, l.WindowField); ok {
			ttl = ms
		}
	}
	if alg == limits.Calendar {
		if ms, ok := calendarTTL(ctx, n, key, d.opts.KeyPrefix, time.Now()); ok {
			ttl = ms
		}
	}
	set, err := n.Do(ctx, n.B().Pexpire().Key(key).Milliseconds(ttl).Nx().Build()).AsInt64()
	if err != nil {
		return nt, fmt.Errorf("pexpire %s: %w", key, err)
	}
	if set == 1 {
		nt.Fixed, nt.TTLMS = true, ttl
	} else {
		nt.Meanwhile = true
	}
	return nt, nil
}

// windowOf reads a key's length from its field "<limit>:<window_ms>".
func windowOf(ctx context.Context, n rueidis.Client, key, field string) (int64, bool) {
	p, err := n.Do(ctx, n.B().Hget().Key(key).Field(field).Build()).ToString()
	if err != nil {
		return 0, false
	}
	_, w, _ := strings.Cut(p, ":")
	ms, err := strconv.ParseInt(w, 10, 64)
	return ms, err == nil && ms >= 1 && ms <= limits.MaxWindowMS
}

// layoutByAlgorithm returns the key layout of the algorithm alg.
func layoutByAlgorithm(alg string) (luascript.Layout, bool) {
	for _, l := range luascript.Layouts {
		if l.Algorithm == alg {
			return l, true
		}
	}
	return luascript.Layout{}, false
}

// requestIDs counts a hash's request-id fields (those matching match) with
// HSCAN and keeps the key if it is among the Top largest.
func (d *doctor) requestIDs(ctx context.Context, n rueidis.Client, key, match string, fields int64) error {
	var ids int64
	var cursor uint64
	idPrefix, _, _ := strings.Cut(match, "*")
	for {
		e, err := n.Do(ctx, n.B().Hscan().Key(key).Cursor(cursor).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return fmt.Errorf("hscan %s: %w", key, err)
		}
		for i := 0; i < len(e.Elements); i += 2 { // field, value pairs
			switch f := e.Elements[i]; {
			case strings.HasPrefix(f, idPrefix):
				ids++
			case strings.HasPrefix(f, luascript.ReservationPrefix):
				d.r.Reservations++
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	if ids == 0 {
		return nil
	}
	d.r.Largest = append(d.r.Largest, RequestIDOf{Key: key, RequestIDs: ids, Fields: fields})
	slices.SortFunc(d.r.Largest, func(a, b RequestIDOf) int {
		return cmp.Or(cmp.Compare(b.RequestIDs, a.RequestIDs), cmp.Compare(a.Key, b.Key))
	})
	if len(d.r.Largest) > d.opts.Top {
		d.r.Largest = d.r.Largest[:d.opts.Top]
	}
	return nil
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%d keys under %q\n", r.Keys, r.Prefix)
	if len(r.Policies) > 0 {
		fmt.Fprintln(tw, "\nkeys per policy:")
		fmt.Fprintln(tw, "  algorithm\tpolicy\tkeys")
		for _, p := range r.Policies {
			name := p.Policy
			switch {
			case p.Inline:
				name = "(inline)"
			case p.Other:
				name = "(not a quotad key name)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\n", p.Algorithm, name, p.Keys)
		}
	}
	fmt.Fprintf(tw, "\nkeys without a TTL: %d\n", len(r.NoTTL))
	for _, k := range r.NoTTL {
		switch {
		case k.Fixed:
			fmt.Fprintf(tw, "  %s\t%s\tTTL restored: %d ms\n", k.Key, k.Algorithm, k.TTLMS)
		case k.Meanwhile:
			fmt.Fprintf(tw, "  %s\t%s\tgot a TTL meanwhile\n", k.Key, k.Algorithm)
		default:
			fmt.Fprintf(tw, "  %s\t%s\tno TTL (run with --fix to restore it)\n", k.Key, k.Algorithm)
		}
	}
	fmt.Fprintf(tw, "\nkeys of the wrong type (not a hash; left alone): %d\n", len(r.WrongType))
	for _, k := range r.WrongType {
		fmt.Fprintf(tw, "  %s\t%s\n", k.Key, k.Type)
	}
	if r.Reservations > 0 {
		fmt.Fprintf(tw, "\nallotment reservations held by sidecars: %d\n", r.Reservations)
	}
	if len(r.Largest) > 0 {
		fmt.Fprintln(tw, "\nlargest request-id sets:")
		for _, k := range r.Largest {
			fmt.Fprintf(tw, "  %s\t%d request ids\t%d fields\n", k.Key, k.RequestIDs, k.Fields)
		}
	}
	if r.Problems == 0 {
		fmt.Fprintln(tw, "\nno problems found")
	} else {
		fmt.Fprintf(tw, "\n%d problems found\n", r.Problems)
	}
	return tw.Flush()
}

// Validate refuses doctor options that cannot work, naming the flag.
func (o Options) Validate() error {
	if o.DefaultTTL < time.Millisecond {
		return errors.New("--default-ttl must be at least 1ms")
	}
	return nil
}
