package integration_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

// exampleLine is one line of an example block: sent (">") or expected ("<").
type exampleLine struct {
	n    int // line number in PROTOCOL.md
	text string
}

type exampleBlock struct {
	start int // line number of the opening fence
	// steps are the block's requests with their replies, in groups: the
	// requests of a group are written back to back (pipelined) before its
	// replies are read. A group is a run of "> " lines followed by as many
	// "< " lines.
	steps [][][2]exampleLine
}

// protocolDoc holds what the test needs from PROTOCOL.md: the config of the
// Examples section and its example blocks.
type protocolDoc struct {
	config string
	blocks []exampleBlock
}

// parseProtocolDoc reads the fenced blocks of PROTOCOL.md. The config is
// the yaml block of the "## Examples" section; every ```example block must
// alternate "> request" and "< reply" lines.
func parseProtocolDoc(path string) (protocolDoc, error) {
	f, err := os.Open(path)
	if err != nil {
		return protocolDoc{}, err
	}
	defer f.Close()
	var doc protocolDoc
	var (
		section string
		fence   string // info string of the open fence; "" outside one
		start   int
		body    []exampleLine
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case fence == "" && strings.HasPrefix(line, "## "):
			section = strings.TrimPrefix(line, "## ")
		case fence == "" && strings.HasPrefix(line, "```"):
			fence, start, body = strings.TrimPrefix(line, "```"), n, nil
			if fence == "" {
				fence = "plain"
			}
		case fence != "" && line == "```":
			switch {
			case fence == "yaml" && section == "Examples":
				if doc.config != "" {
					return doc, fmt.Errorf("line %d: a second yaml block in the Examples section", start)
				}
				for _, l := range body {
					doc.config += l.text + "\n"
				}
			case fence == "example":
				b, err := exampleSteps(start, body)
				if err != nil {
					return doc, err
				}
				doc.blocks = append(doc.blocks, b)
			}
			fence = ""
		case fence != "":
			body = append(body, exampleLine{n: n, text: line})
		}
	}
	if err := sc.Err(); err != nil {
		return doc, err
	}
	if fence != "" {
		return doc, fmt.Errorf("line %d: unclosed fence", start)
	}
	if doc.config == "" {
		return doc, fmt.Errorf("no yaml config block in the Examples section")
	}
	if len(doc.blocks) == 0 {
		return doc, fmt.Errorf("no example blocks")
	}
	return doc, nil
}

func exampleSteps(start int, body []exampleLine) (exampleBlock, error) {
	b := exampleBlock{start: start}
	for i := 0; i < len(body); {
		var reqs, reps []exampleLine
		for ; i < len(body) && strings.HasPrefix(body[i].text, "> "); i++ {
			reqs = append(reqs, body[i])
		}
		for ; i < len(body) && strings.HasPrefix(body[i].text, "< "); i++ {
			reps = append(reps, body[i])
		}
		switch {
		case len(reqs) == 0 && i < len(body):
			return b, fmt.Errorf("line %d: want a \"> \" request line, got %q", body[i].n, body[i].text)
		case len(reqs) == 0:
			return b, fmt.Errorf("line %d: reply lines without a request before them", reps[0].n)
		case len(reps) != len(reqs):
			return b, fmt.Errorf("line %d: %d requests followed by %d replies, want as many", reqs[0].n, len(reqs), len(reps))
		}
		group := make([][2]exampleLine, len(reqs))
		for k := range reqs {
			group[k] = [2]exampleLine{
				{n: reqs[k].n, text: strings.TrimPrefix(reqs[k].text, "> ")},
				{n: reps[k].n, text: strings.TrimPrefix(reps[k].text, "< ")},
			}
		}
		b.steps = append(b.steps, group)
	}
	if len(b.steps) == 0 {
		return b, fmt.Errorf("line %d: empty example block", start)
	}
	return b, nil
}

// objectKeys returns the keys of a JSON object in the order written.
func objectKeys(line string) ([]string, error) {
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%q is not a JSON object", line)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// compareReply lists how got differs from the example's expected reply.
// Every field must be equal, in the documented order, except: message is
// for people (present and non-empty when expected), version is any string,
// and a time that is non-zero in the example may be anything in 1..60000
// (milliseconds), or in the header fields (a t= parameter, Retry-After)
// anything in 1..60 (seconds).
func compareReply(t *testing.T, want string, got reply) []string {
	t.Helper()
	exp, err := parseReply(want)
	if err != nil {
		t.Fatalf("the example's reply: %v", err)
	}
	wantKeys, err := objectKeys(want)
	if err != nil {
		t.Fatalf("the example's reply: %v", err)
	}
	gotKeys, err := objectKeys(got.raw)
	if err != nil {
		return []string{err.Error()}
	}
	var diffs []string
	if !slices.Equal(wantKeys, gotKeys) {
		diffs = append(diffs, fmt.Sprintf("fields %v, want %v", gotKeys, wantKeys))
	}
	for _, k := range wantKeys {
		e, a := exp.fields[k], got.fields[k]
		switch k {
		case "message":
			if s, _ := a.(string); s == "" {
				diffs = append(diffs, "message missing or empty")
			}
		case "version":
			if _, ok := a.(string); !ok {
				diffs = append(diffs, fmt.Sprintf("version %v is not a string", a))
			}
		case "reset_ms", "retry_after_ms":
			en, _ := e.(json.Number)
			an, ok := a.(json.Number)
			av, err := an.Int64()
			switch {
			case !ok || err != nil:
				diffs = append(diffs, fmt.Sprintf("%s %v is not an integer", k, a))
			case en == "0" && av != 0:
				diffs = append(diffs, fmt.Sprintf("%s %d, want 0", k, av))
			case en != "0" && (av < 1 || av > max(60000, exampleMax(en))):
				diffs = append(diffs, fmt.Sprintf("%s %d, want 1..%d", k, av, max(60000, exampleMax(en))))
			}
		case "headers":
			diffs = append(diffs, compareHeaders(e, a)...)
		case "checks":
			diffs = append(diffs, compareChecks(t, want, got.raw)...)
		default:
			if !reflect.DeepEqual(e, a) {
				diffs = append(diffs, fmt.Sprintf("%s %v, want %v", k, a, e))
			}
		}
	}
	return diffs
}

// compareChecks compares the checks of a take of several limits, each as
// compareReply compares a reply.
func compareChecks(t *testing.T, want, got string) []string {
	t.Helper()
	var w, g struct {
		Checks []json.RawMessage `json:"checks"`
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("the example's checks: %v", err)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil || len(g.Checks) != len(w.Checks) {
		return []string{fmt.Sprintf("checks %s, want %d (%v)", got, len(w.Checks), err)}
	}
	var diffs []string
	for i := range w.Checks {
		// A check has no "ok": compared as the reply it would be with one.
		withOK := func(raw json.RawMessage) string { return `{"ok":true,` + string(raw[1:]) }
		gr, err := parseReply(withOK(g.Checks[i]))
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("check %d: %v", i+1, err))
			continue
		}
		for _, d := range compareReply(t, withOK(w.Checks[i]), gr) {
			diffs = append(diffs, fmt.Sprintf("check %d: %s", i+1, d))
		}
	}
	return diffs
}

// headerSeconds is a time in a header field value: a t= parameter, or a
// whole Retry-After value.
var headerSeconds = regexp.MustCompile(`(;t=|^)([0-9]+)(,|;|$)`)

// compareHeaders compares a reply's headers field with the example's: the
// same field names, and values equal but for their times, where a
// non-zero one in the example matches any from 1 to 60.
func compareHeaders(want, got any) []string {
	w, ok1 := want.(map[string]any)
	g, ok2 := got.(map[string]any)
	if !ok1 || !ok2 {
		return []string{fmt.Sprintf("headers %v, want %v", got, want)}
	}
	var diffs []string
	if !slices.Equal(slices.Sorted(maps.Keys(w)), slices.Sorted(maps.Keys(g))) {
		diffs = append(diffs, fmt.Sprintf("header fields %v, want %v", slices.Sorted(maps.Keys(g)), slices.Sorted(maps.Keys(w))))
	}
	for name, wv := range w {
		ws, _ := wv.(string)
		gs, ok := g[name].(string)
		if !ok {
			continue
		}
		wn, gn := headerSeconds.FindAllStringSubmatch(ws, -1), headerSeconds.FindAllStringSubmatch(gs, -1)
		same := len(wn) == len(gn) &&
			headerSeconds.ReplaceAllString(ws, "${1}*${3}") == headerSeconds.ReplaceAllString(gs, "${1}*${3}")
		for i := 0; same && i < len(wn); i++ {
			n, _ := strconv.Atoi(gn[i][2])
			if wn[i][2] == "0" && n != 0 || wn[i][2] != "0" && (n < 1 || n > 60) {
				same = false
			}
		}
		if !same {
			diffs = append(diffs, fmt.Sprintf("header %s %q, want %q (times 1..60 where not 0)", name, gs, ws))
		}
	}
	return diffs
}

// TestProtocolExamples runs every example of PROTOCOL.md against the real
// sidecar, each on a fresh connection to a sidecar started with the doc's
// config and its own key prefix, sending one line and reading one reply at
// a time.
func TestProtocolExamples(t *testing.T) {
	t.Parallel()
	docPath := filepath.Join(moduleRoot, "protocol", "PROTOCOL.md")
	doc, err := parseProtocolDoc(docPath)
	if err != nil {
		t.Fatalf("%s: %v", docPath, err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(doc.config), 0o600); err != nil {
		t.Fatal(err)
	}
	r := redistest.Start(t)

	for _, b := range doc.blocks {
		t.Run(fmt.Sprintf("PROTOCOL.md:%d", b.start), func(t *testing.T) {
			sc := startSidecar(t, r.URL(), "--config", cfg)
			c := sc.dial(t)
			for _, group := range b.steps {
				for _, step := range group {
					c.send(step[0].text)
				}
				for _, step := range group {
					req, want := step[0], step[1]
					got := c.read()
					if diffs := compareReply(t, want.text, got); len(diffs) > 0 {
						t.Errorf("PROTOCOL.md:%d: %s\n  got  %s\n  want %s (line %d)\n  %s",
							req.n, req.text, got, want.text, want.n, strings.Join(diffs, "\n  "))
					}
				}
			}
			assertKeysHaveTTL(t, r, sc.prefix)
		})
	}
}

// TestCompareReplyCatchesDifferences guards the leniency of compareReply:
// it must forgive only what it says it forgives.
func TestCompareReplyCatchesDifferences(t *testing.T) {
	t.Parallel()
	const want = `{"id":1,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60000,"retry_after_ms":0}`
	cases := []struct {
		got   string
		diffs int
	}{
		{want, 0},
		{`{"id":1,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":1,"retry_after_ms":0}`, 0},
		{`{"id":"1","ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60000,"retry_after_ms":0}`, 1},
		{`{"id":1,"ok":true,"allowed":true,"replay":false,"limit":5,"used":3,"remaining":3,"reset_ms":60000,"retry_after_ms":0}`, 1},
		{`{"id":1,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":0,"retry_after_ms":0}`, 1},
		{`{"id":1,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60001,"retry_after_ms":0}`, 1},
		{`{"id":1,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60000,"retry_after_ms":7}`, 1},
		{`{"ok":true,"id":1,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60000,"retry_after_ms":0}`, 1},
		{`{"id":1,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60000,"retry_after_ms":0,"extra":1}`, 1},
		{`{"id":1,"ok":true,"allowed":true,"replay":false,"limit":5,"used":2,"remaining":3,"reset_ms":60000}`, 2},
	}
	for _, tc := range cases {
		got, err := parseReply(tc.got)
		if err != nil {
			t.Fatal(err)
		}
		if diffs := compareReply(t, want, got); len(diffs) != tc.diffs {
			t.Errorf("%s: %d differences %q, want %d", tc.got, len(diffs), diffs, tc.diffs)
		}
	}
	const wantHeaders = `{"ok":true,"limit":5,"used":5,"remaining":0,"reset_ms":60000,` +
		`"headers":{"RateLimit-Policy":"\"api\";q=5;w=60","RateLimit":"\"api\";r=0;t=60","Retry-After":"60"}}`
	for got, n := range map[string]int{
		wantHeaders: 0,
		`{"ok":true,"limit":5,"used":5,"remaining":0,"reset_ms":60000,` +
			`"headers":{"RateLimit-Policy":"\"api\";q=5;w=60","RateLimit":"\"api\";r=0;t=1","Retry-After":"59"}}`: 0,
		`{"ok":true,"limit":5,"used":5,"remaining":0,"reset_ms":60000,` +
			`"headers":{"RateLimit-Policy":"\"api\";q=5;w=61","RateLimit":"\"api\";r=0;t=60","Retry-After":"60"}}`: 1,
		`{"ok":true,"limit":5,"used":5,"remaining":0,"reset_ms":60000,` +
			`"headers":{"RateLimit-Policy":"\"api\";q=5;w=60","RateLimit":"\"api\";r=1;t=60","Retry-After":"60"}}`: 1,
		`{"ok":true,"limit":5,"used":5,"remaining":0,"reset_ms":60000,` +
			`"headers":{"RateLimit-Policy":"\"api\";q=5;w=60","RateLimit":"\"api\";r=0;t=0","Retry-After":"61"}}`: 2,
		`{"ok":true,"limit":5,"used":5,"remaining":0,"reset_ms":60000,` +
			`"headers":{"RateLimit-Policy":"\"api\";q=5;w=60","RateLimit":"\"api\";r=0;t=60"}}`: 1,
	} {
		r, err := parseReply(got)
		if err != nil {
			t.Fatal(err)
		}
		if diffs := compareReply(t, wantHeaders, r); len(diffs) != n {
			t.Errorf("%s: %d differences %q, want %d", got, len(diffs), diffs, n)
		}
	}
	const wantErr = `{"ok":false,"error":"CONFLICT","message":"request_id was accepted with cost 2"}`
	for got, n := range map[string]int{
		`{"ok":false,"error":"CONFLICT","message":"another wording"}`: 0,
		`{"ok":false,"error":"CONFLICT","message":""}`:                1,
		`{"ok":false,"error":"POLICY","message":"x"}`:                 1,
	} {
		r, err := parseReply(got)
		if err != nil {
			t.Fatal(err)
		}
		if diffs := compareReply(t, wantErr, r); len(diffs) != n {
			t.Errorf("%s: %d differences %q, want %d", got, len(diffs), diffs, n)
		}
	}
}

// exampleMax is the bound an example's reset_ms or retry_after_ms above
// 60000 sets: a calendar window's shows its period's length, the most the
// time to its end can be.
func exampleMax(n json.Number) int64 {
	v, _ := n.Int64()
	return v
}
