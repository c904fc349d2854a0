package integration_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"quotad/integration/redistest"
)

// multiMember is what one check's members of the header fields must say.
type multiMember struct {
	name string
	algo string
	w    int64
	unit string
}

// The header fields of takes of several limits: every check is its own
// member of RateLimit-Policy and RateLimit, in order, as a third-party
// Structured Field parser reads them, with each check's numbers; a
// skipped check is in RateLimit-Policy only.
func TestTakeOfChecksHeadersParsedByStructuredHeaders(t *testing.T) {
	t.Parallel()
	parser := npmCached(t, "structured-headers", structuredHeadersVersion)
	node := lookPath(t, "node")
	cfg := filepath.Join(t.TempDir(), "policies.yaml")
	writeFileAtomically(t, cfg, `policies:
  per-user:
    limit: 2
    window: 1m
  per-tenant:
    algorithm: token_bucket
    rate: 1
    period: 10s
    burst: 3
  jobs:
    algorithm: concurrency
    limit: 2
    lease: 1m
  trial:
    limit: 1
    window: 1m
    mode: shadow
`)
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL(), "--config", cfg)
	c := sc.dial(t)
	user := multiMember{"per-user", "fixed_window", 60, ""}
	tenant := multiMember{"per-tenant", "token_bucket", 30, ""}
	jobs := multiMember{"jobs", "concurrency", 0, "concurrent-requests"}
	trial := multiMember{"trial", "fixed_window", 60, ""}
	type decision struct {
		rep     reply
		members []multiMember
	}
	var decisions []decision
	ask := func(line string, members ...multiMember) reply {
		t.Helper()
		rep := c.do(line)
		if !rep.ok() {
			t.Fatalf("%s: %s", line, rep)
		}
		decisions = append(decisions, decision{rep, members})
		return rep
	}
	ut := `{"op":"take","headers":true,"checks":[{"policy":"per-user","subject":"u"},{"policy":"per-tenant","subject":"t"}]}`
	wantFlag(t, ask(ut, user, tenant), "allowed", true)
	wantFlag(t, ask(`{"op":"take","headers":true,"request_id":"j1","checks":[{"policy":"jobs","subject":"j"},{"policy":"per-tenant","subject":"t","cost":2},{"policy":"trial","subject":"s"}]}`,
		jobs, tenant, trial), "allowed", true)
	// The tenant's bucket is empty: denied by Redis, then by the local denial.
	wantFlag(t, ask(ut, user, tenant), "allowed", false)
	local := ask(ut, user, tenant)
	wantFlag(t, local, "allowed", false)
	if checks, _ := local.fields["checks"].([]any); len(checks) != 2 || checks[0].(map[string]any)["skipped"] != true {
		t.Fatalf("second denial %s: want the user's check skipped by the local denial", local)
	}

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
		rep := d.rep
		fail := func(format string, args ...any) {
			t.Helper()
			t.Errorf("reply %s\n  "+format, append([]any{rep}, args...)...)
		}
		denied := rep.fields["allowed"] == false
		retry := (rep.num(t, "retry_after_ms") + 999) / 1000
		if h := headersOf(t, rep); denied != (h["Retry-After"] != "") || denied && h["Retry-After"] != strconv.FormatInt(retry, 10) {
			fail("Retry-After %q, want %d when denied", h["Retry-After"], retry)
		}
		checks, _ := rep.fields["checks"].([]any)
		if len(checks) != len(d.members) || len(parsed[i].Policy) != len(d.members) {
			fail("%d checks, %d RateLimit-Policy members, want %d", len(checks), len(parsed[i].Policy), len(d.members))
			continue
		}
		var state []sfMember
		for j, m := range d.members {
			ch := reply{raw: rep.raw, fields: checks[j].(map[string]any)}
			wantPolicy := map[string]int64{"q": ch.num(t, "limit")}
			if m.w > 0 {
				wantPolicy["w"] = m.w
			}
			checkMember(t, fail, "RateLimit-Policy member "+strconv.Itoa(j+1), parsed[i].Policy[j:j+1], m.name, wantPolicy, m.unit)
			if ch.fields["skipped"] == true {
				continue
			}
			if len(parsed[i].RateLimit) <= len(state) {
				fail("RateLimit has %d members, want one for check %d", len(parsed[i].RateLimit), j+1)
				break
			}
			member := parsed[i].RateLimit[len(state) : len(state)+1]
			state = append(state, member[0])
			wantState := map[string]int64{"r": ch.num(t, "remaining")}
			if m.algo != "concurrency" {
				reset := (ch.num(t, "reset_ms") + 999) / 1000
				if denied {
					reset = min(reset, retry)
				}
				wantState["t"] = reset
			}
			checkMember(t, fail, "RateLimit member for check "+strconv.Itoa(j+1), member, m.name, wantState, "")
		}
		if len(state) != len(parsed[i].RateLimit) {
			fail("RateLimit has %d members, want %d", len(parsed[i].RateLimit), len(state))
		}
	}
	t.Logf("%d takes of several limits: header fields parsed by structured-headers %s and checked", len(decisions), structuredHeadersVersion)
}
