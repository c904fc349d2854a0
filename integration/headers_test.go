package integration_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"quotad/integration/redistest"
)

// structuredHeadersVersion is the Structured Field parser (RFC 9651, npm
// package structured-headers) that reads the RateLimit header fields the
// sidecar writes: one this project did not write.
const structuredHeadersVersion = "2.1.0"

// parseFieldsScript reads a JSON array of {policy, ratelimit} field values
// from the file named by its argument and prints, for each, both fields as
// structured-headers parses them: a List of items, each with its bare
// item's kind and value and its parameters'. A value that is not a valid
// List makes parseList throw, and the script exit non-zero.
const parseFieldsScript = `import fs from 'node:fs';
import { parseList, Token, DisplayString } from 'structured-headers';

function bare(v) {
  if (typeof v === 'string') return { kind: 'string', value: v };
  if (v instanceof Token) return { kind: 'token', value: v.toString() };
  if (v instanceof DisplayString) return { kind: 'displaystring', value: v.toString() };
  if (v instanceof ArrayBuffer) return { kind: 'bytes', value: v.byteLength };
  if (typeof v === 'number') return { kind: Number.isInteger(v) ? 'integer' : 'decimal', value: v };
  return { kind: typeof v, value: String(v) };
}

function list(field) {
  if (field === undefined) return null;
  return parseList(field).map(([v, params]) => ({
    ...bare(v),
    params: Object.fromEntries([...params].map(([k, p]) => [k, bare(p)])),
  }));
}

const out = JSON.parse(fs.readFileSync(process.argv[2], 'utf8')).map((f) => ({
  policy: list(f.policy),
  ratelimit: list(f.ratelimit),
}));
console.log(JSON.stringify(out));
`

// sfBare is a bare item as the parser read it.
type sfBare struct {
	Kind  string          `json:"kind"`
	Value json.RawMessage `json:"value"`
}

type sfMember struct {
	sfBare
	Params map[string]sfBare `json:"params"`
}

// headerDecision is one reply that asked for the header fields, with what
// its fields must say beyond the reply's own numbers.
type headerDecision struct {
	req   string
	rep   reply
	name  string // the item: the policy, or "inline"
	algo  string
	w     int64  // the RateLimit-Policy window in seconds
	unit  string // qu; "" for none
	shown bool   // the RateLimit field is there (not degraded)
}

// TestRateLimitHeadersParsedByStructuredHeaders drives a real sidecar
// through allowed, denied (by Redis and by the local denial), replayed,
// shadow, peeked and degraded decisions of every algorithm, has a
// third-party Structured Field parser read every header field value they
// carry, and checks what it read against the decision's own fields: limit,
// remaining, reset_ms and retry_after_ms.
func TestRateLimitHeadersParsedByStructuredHeaders(t *testing.T) {
	t.Parallel()
	parser := npmCached(t, "structured-headers", structuredHeadersVersion)
	node := lookPath(t, "node")
	cfg := filepath.Join(t.TempDir(), "policies.yaml")
	writeFileAtomically(t, cfg, `policies:
  api:
    limit: 2
    window: 1m
  uploads:
    algorithm: token_bucket
    rate: 1
    period: 10s
    burst: 2
  jobs:
    algorithm: concurrency
    limit: 1
    lease: 1m
  trial:
    limit: 1
    window: 1m
    mode: shadow
  open:
    limit: 3
    window: 1m
    on_unavailable: allow
  closed:
    limit: 3
    window: 1m
    on_unavailable: deny
`)
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL(), "--config", cfg)
	c := sc.dial(t)

	var decisions []headerDecision
	ask := func(name, algo string, w int64, unit, line string) reply {
		t.Helper()
		rep := c.do(line)
		if !rep.ok() {
			t.Fatalf("%s: %s", line, rep)
		}
		decisions = append(decisions, headerDecision{req: line, rep: rep, name: name, algo: algo, w: w, unit: unit, shown: true})
		return rep
	}
	const (
		fixed  = "fixed_window"
		bucket = "token_bucket"
		leases = "concurrency"
		cr     = "concurrent-requests"
	)
	// Fixed window: allowed, replayed, allowed to the limit, denied, peeked,
	// and a peek before any window opened.
	ask("api", fixed, 60, "", `{"op":"take","subject":"f","policy":"api","request_id":"a1","headers":true}`)
	wantFlag(t, ask("api", fixed, 60, "", `{"op":"take","subject":"f","policy":"api","request_id":"a1","headers":true}`), "replay", true)
	ask("api", fixed, 60, "", `{"op":"take","subject":"f","policy":"api","headers":true}`)
	wantFlag(t, ask("api", fixed, 60, "", `{"op":"take","subject":"f","policy":"api","headers":true}`), "allowed", false)
	// Denied again, now by the sidecar from the denial it remembers.
	wantFlag(t, ask("api", fixed, 60, "", `{"op":"take","subject":"f","policy":"api","headers":true}`), "allowed", false)
	ask("api", fixed, 60, "", `{"op":"peek","subject":"f","policy":"api","headers":true}`)
	ask("api", fixed, 60, "", `{"op":"peek","subject":"unused","policy":"api","headers":true}`)
	ask("inline", fixed, 2, "", `{"op":"take","subject":"fi","limit":3,"window_ms":1500,"headers":true}`)
	// Token bucket: q the burst, w its refill (2 tokens at 1 per 10 s).
	ask("uploads", bucket, 20, "", `{"op":"take","subject":"b","policy":"uploads","headers":true}`)
	ask("uploads", bucket, 20, "", `{"op":"take","subject":"b","policy":"uploads","headers":true}`)
	wantFlag(t, ask("uploads", bucket, 20, "", `{"op":"take","subject":"b","policy":"uploads","cost":2,"headers":true}`), "allowed", false)
	ask("uploads", bucket, 20, "", `{"op":"peek","subject":"b","policy":"uploads","headers":true}`)
	ask("uploads", bucket, 20, "", `{"op":"peek","subject":"full","policy":"uploads","headers":true}`)
	ask("inline", bucket, 1, "", `{"op":"take","subject":"bi","algorithm":"token_bucket","rate":5,"period_ms":1000,"burst":5,"headers":true}`)
	// Concurrency: a lease, a denial, a replay of the lease, a peek.
	ask("jobs", leases, 0, cr, `{"op":"take","subject":"c","policy":"jobs","request_id":"j1","headers":true}`)
	wantFlag(t, ask("jobs", leases, 0, cr, `{"op":"take","subject":"c","policy":"jobs","request_id":"j2","headers":true}`), "allowed", false)
	wantFlag(t, ask("jobs", leases, 0, cr, `{"op":"take","subject":"c","policy":"jobs","request_id":"j1","headers":true}`), "replay", true)
	ask("jobs", leases, 0, cr, `{"op":"peek","subject":"c","policy":"jobs","headers":true}`)
	ask("inline", leases, 0, cr, `{"op":"take","subject":"ci","algorithm":"concurrency","limit":2,"lease_ms":30000,"request_id":"j","headers":true}`)
	// Shadow: the second take would be denied under enforcement; the
	// caller is allowed, so there is no Retry-After.
	ask("trial", fixed, 60, "", `{"op":"take","subject":"s","policy":"trial","headers":true}`)
	wantFlag(t, ask("trial", fixed, 60, "", `{"op":"take","subject":"s","policy":"trial","headers":true}`), "shadow_allowed", false)

	// Without the flag, or with false, a reply has no headers field.
	for _, line := range []string{
		`{"op":"take","subject":"n","policy":"api"}`, `{"op":"peek","subject":"n","policy":"api","headers":false}`,
	} {
		if rep := c.do(line); !rep.ok() || rep.fields["headers"] != nil {
			t.Errorf("%s: got %s, want no headers field", line, rep)
		}
	}
	wantError(t, c.do(`{"op":"release","subject":"c","policy":"jobs","request_id":"j1","headers":true}`), "INVALID")

	// Degraded: Redis cannot decide and on_unavailable answers.
	r.Stop(t)
	eventually(t, "ping to report redis_ok false", func() bool {
		return !c.do(`{"op":"ping"}`).flag(t, "redis_ok")
	})
	for _, p := range []string{"open", "closed"} {
		rep := ask(p, fixed, 60, "", `{"op":"take","subject":"d","policy":"`+p+`","headers":true}`)
		wantFlag(t, rep, "degraded", true)
		decisions[len(decisions)-1].shown = false
	}

	// Every value through the parser, in one run.
	type fields struct {
		Policy    string  `json:"policy"`
		RateLimit *string `json:"ratelimit,omitempty"`
	}
	var in []fields
	for _, d := range decisions {
		h := headersOf(t, d.rep)
		f := fields{Policy: h["RateLimit-Policy"]}
		if v, ok := h["RateLimit"]; ok {
			f.RateLimit = &v
		}
		in = append(in, f)
	}
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(parser, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"parse.mjs": parseFieldsScript, "fields.json": mustJSON(t, in)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := run(t, dir, cleanEnv(), cliTimeout, node, "parse.mjs", "fields.json")
	var parsed []struct {
		Policy    []sfMember `json:"policy"`
		RateLimit []sfMember `json:"ratelimit"`
	}
	if err := json.Unmarshal([]byte(out), &parsed); err != nil || len(parsed) != len(decisions) {
		t.Fatalf("the parser printed %d results for %d decisions (%v):\n%s", len(parsed), len(decisions), err, out)
	}
	for i, d := range decisions {
		checkHeaderFields(t, d, parsed[i].Policy, parsed[i].RateLimit)
	}
	t.Logf("%d decisions' header fields parsed by structured-headers %s and checked", len(decisions), structuredHeadersVersion)
}

func wantFlag(t *testing.T, rep reply, key string, want bool) {
	t.Helper()
	if got := rep.flag(t, key); got != want {
		t.Fatalf("reply %s: %s %v, want %v", rep, key, got, want)
	}
}

// headersOf is a reply's headers field, which must be its last.
func headersOf(t *testing.T, rep reply) map[string]string {
	t.Helper()
	keys, err := objectKeys(rep.raw)
	if err != nil || len(keys) == 0 || keys[len(keys)-1] != "headers" {
		t.Fatalf("reply %s: fields %v, want headers last (%v)", rep, keys, err)
	}
	obj, ok := rep.fields["headers"].(map[string]any)
	if !ok {
		t.Fatalf("reply %s: headers is not an object", rep)
	}
	h := map[string]string{}
	for k, v := range obj {
		s, ok := v.(string)
		if !ok {
			t.Fatalf("reply %s: headers[%q] is not a string", rep, k)
		}
		h[k] = s
	}
	return h
}

var delaySeconds = regexp.MustCompile(`^[0-9]+$`)

// checkHeaderFields compares what the parser read with the decision.
func checkHeaderFields(t *testing.T, d headerDecision, policy, state []sfMember) {
	t.Helper()
	rep := d.rep
	secs := func(key string) int64 { return (rep.num(t, key) + 999) / 1000 }
	denied := rep.fields["allowed"] == false
	h := headersOf(t, rep)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s\n  reply %s\n  "+format, append([]any{d.req, rep}, args...)...)
	}
	wantKeys := []string{"RateLimit-Policy"}
	if d.shown {
		wantKeys = append(wantKeys, "RateLimit")
	}
	if denied {
		wantKeys = append(wantKeys, "Retry-After")
	}
	var gotKeys []string
	for k := range h {
		gotKeys = append(gotKeys, k)
	}
	slices.Sort(gotKeys)
	slices.Sort(wantKeys)
	if !slices.Equal(gotKeys, wantKeys) {
		fail("header fields %v, want %v", gotKeys, wantKeys)
	}
	if denied {
		if v := h["Retry-After"]; !delaySeconds.MatchString(v) || v != strconv.FormatInt(secs("retry_after_ms"), 10) {
			fail("Retry-After %q, want the delay-seconds %d rounded up from retry_after_ms", v, secs("retry_after_ms"))
		}
	}

	wantPolicy := map[string]int64{"q": rep.num(t, "limit")}
	if d.w > 0 {
		wantPolicy["w"] = d.w
	}
	checkMember(t, fail, "RateLimit-Policy", policy, d.name, wantPolicy, d.unit)
	if !d.shown {
		if state != nil {
			fail("a degraded answer has a RateLimit field")
		}
		return
	}
	wantState := map[string]int64{"r": rep.num(t, "remaining")}
	if d.algo != "concurrency" {
		reset := secs("reset_ms")
		if d.algo == "fixed_window" && rep.num(t, "reset_ms") == 0 {
			reset = d.w // no window open: a take opens one of w
		}
		if denied {
			reset = min(reset, secs("retry_after_ms"))
		}
		wantState["t"] = reset
	}
	checkMember(t, fail, "RateLimit", state, d.name, wantState, "")
}

// checkMember: the field is a List of one item, an sf-string naming the
// limit, whose parameters are exactly want (Integers) and qu (a String)
// when unit is set.
func checkMember(t *testing.T, fail func(string, ...any), field string, list []sfMember, name string, want map[string]int64, unit string) {
	t.Helper()
	if len(list) != 1 {
		fail("%s parsed as %d members, want 1", field, len(list))
		return
	}
	m := list[0]
	if m.Kind != "string" || string(m.Value) != strconv.Quote(name) {
		fail("%s item %s %s, want the sf-string %q", field, m.Kind, m.Value, name)
	}
	n := len(want)
	if unit != "" {
		n++
		if qu := m.Params["qu"]; qu.Kind != "string" || string(qu.Value) != strconv.Quote(unit) {
			fail("%s qu %s %s, want the sf-string %q", field, qu.Kind, qu.Value, unit)
		}
	}
	if len(m.Params) != n {
		fail("%s parameters %v, want %v (qu %q)", field, m.Params, want, unit)
	}
	for k, v := range want {
		p, ok := m.Params[k]
		if !ok || p.Kind != "integer" || string(p.Value) != strconv.FormatInt(v, 10) {
			fail("%s parameter %s: %s %s, want the Integer %d", field, k, p.Kind, p.Value, v)
		}
	}
}
