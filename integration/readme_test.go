package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocs reads README.md and every page of docs/ from top to bottom and
// runs their examples in that order, as a newcomer pastes them, each page
// against a sidecar of its own started as `make run` starts it: the
// embedded store, listening on ./quotad.sock in a working directory shared
// by the pages. That directory also holds bin/quotad, the binary under
// test, where `make run` leaves it (it is not on PATH, as it is not for a
// reader), and copies of the Python and Node clients, as the README says to
// copy them. Each page is a subtest (README.md, docs-algorithms.md, ...),
// and each fenced block a subtest of its page named after its line, run or
// skipped with its reason. A page starts from an empty store, so no page's
// examples depend on another's.
//
// A fence is ``` at the start of a line; an indented fence (in a list
// item, a quote) or a ~~~ fence is an error rather than a block left out.
// What a block's language means:
//
//   - ```console: a shell session. A line starting with "$ " is a command
//     (a line ending in "\" continues on the next); the lines after it, up
//     to the next "$ ", are what it prints, stdout and stderr together.
//     Each command runs on its own with `bash -o pipefail -c` and must
//     exit 0.
//   - ```sh, ```bash, ```shell: a script, run whole with
//     `bash -e -o pipefail`.
//   - ```python, ```py: run with python3.
//   - ```js, ```mjs: an ES module, run with node.
//   - ```text right after a script, Python or Node block (blank lines
//     between at most) is what that block prints. A block of those
//     languages with no ```text after it must print nothing. A ```text
//     block after a block that is not run is shown, not checked.
//   - ```yaml and blocks without a language are not programs and are not
//     run. Any other language fails the test until it is given a meaning
//     here (readmeLanguages).
//
// A block of a runnable language that must not run (it needs a cluster,
// serves until Ctrl-C, runs a long benchmark) has a marker on its own line
// right before its fence, blank lines between at most:
//
//	<!-- not run: needs a Kubernetes cluster -->
//
// The reason is required and shows as the subtest's skip message
// (`go test -v -run TestDocs ./integration/`). A marker before a block
// that would not run anyway, or before anything but a fence, is an error.
//
// Expected output is compared line by line, ignoring trailing spaces. In an
// expected line, "…" stands for any text within the line (a version, a
// duration). A line that is a protocol reply ({"ok":...}) and has no "…"
// compares as PROTOCOL.md's examples do (compareReply): the same fields in
// the same order with equal values, except that a non-zero reset_ms or
// retry_after_ms may be anything from 1 to 60000 (or to the value written,
// when that is more), a message any non-empty
// text and a version any string. Every other line must be equal.
func TestDocs(t *testing.T) {
	t.Parallel()
	type page struct {
		path   string // relative to the module root, with slashes
		blocks []readmeBlock
		runs   bool // some block of it runs
	}
	var pages []page
	for _, path := range docPages(t) {
		f, err := os.Open(filepath.Join(moduleRoot, filepath.FromSlash(path)))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := parseReadme(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		p := page{path: path, blocks: blocks}
		for _, b := range blocks {
			p.runs = p.runs || b.skip == ""
		}
		pages = append(pages, p)
	}
	w := newReadmeWorkdir(t)

	ran := 0
	for _, p := range pages {
		t.Run(pageName(p.path), func(t *testing.T) {
			if p.runs {
				// Stopped when this page's subtest ends, so the next page's
				// sidecar takes ./quotad.sock over an empty store.
				sc := launchSidecar(t, filepath.Join(w.dir, "quotad.sock"), "")
				sc.waitReady(t)
			}
			pageRan := 0
			for _, b := range p.blocks {
				t.Run(b.name(), func(t *testing.T) {
					if b.skip != "" {
						t.Skip(b.skip)
					}
					pageRan++
					w.runBlock(t, p.path, b)
				})
			}
			ran += pageRan
			t.Logf("%s: ran %d of %d blocks", p.path, pageRan, len(p.blocks))
		})
	}
	if ran == 0 {
		t.Fatal("README.md and docs/ have no example that runs")
	}
}

// docPages lists the pages whose examples TestDocs runs, relative to the
// module root: README.md, then every .md file under docs/ in lexical
// order. A docs/ without a page fails the test rather than running only
// the README.
func docPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md"}
	docs := filepath.Join(moduleRoot, "docs")
	err := filepath.WalkDir(docs, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".md") {
			return err
		}
		rel, err := filepath.Rel(moduleRoot, path)
		pages = append(pages, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatalf("list docs/: %v", err)
	}
	if len(pages) == 1 {
		t.Fatal("docs/ holds no .md page")
	}
	return pages
}

// pageName is a page's subtest name and the stem of its examples' files:
// docs/algorithms.md is docs-algorithms.md.
func pageName(path string) string {
	return strings.ReplaceAll(path, "/", "-")
}

// TestDocsLinks checks every relative link of the project's Markdown
// pages (README.md, docs/, PROTOCOL.md, the clients' READMEs, ...): the
// file or directory it names exists, and its #anchor, if any, is a heading
// of that page as GitHub spells heading anchors. A page moved or a heading
// renamed fails here rather than in a reader's browser.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	anchors := map[string]map[string]bool{} // page path -> its anchors
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a
	}
	checked := 0
	for _, page := range markdownPages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(moduleRoot, page)
		for n, line := range proseLines(string(b)) {
			for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if urlScheme.MatchString(target) {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: link %s: no such file", rel, n+1, target)
					continue
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(path, ".md") {
					t.Errorf("%s:%d: link %s: an anchor into a file that is not Markdown", rel, n+1, target)
				} else if !anchorsOf(path)[anchor] {
					t.Errorf("%s:%d: link %s: no heading of that page has the anchor #%s", rel, n+1, target, anchor)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found in the Markdown pages")
	}
}

var (
	// markdownLink is an inline link or image, [text](target); its
	// target has no spaces in these pages.
	markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	urlScheme    = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)
	headingLine  = regexp.MustCompile(`^#{1,6} +(.*?) *#* *$`)
	// notInAnchor is what GitHub drops from a heading to make its anchor.
	notInAnchor = regexp.MustCompile(`[^\p{L}\p{N}_ -]`)
)

// markdownPages lists the Markdown files of the repository, leaving out
// hidden directories, node_modules and testdata.
func markdownPages(t *testing.T) []string {
	t.Helper()
	var pages []string
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != moduleRoot && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list the Markdown pages: %v", err)
	}
	if len(pages) == 0 {
		t.Fatal("no Markdown page found")
	}
	return pages
}

// proseLines is a page's lines with those inside fenced blocks blanked,
// so that line numbers stay the page's.
func proseLines(doc string) []string {
	lines := strings.Split(doc, "\n")
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
			lines[i] = ""
		} else if fenced {
			lines[i] = ""
		}
	}
	return lines
}

// headingAnchors is the set of anchors GitHub gives a page's headings:
// lower case, without punctuation (backticks, colons, slashes, ...), each
// space a hyphen, and -1, -2, ... after a repeated one.
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(doc) {
		m := headingLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		a := strings.ReplaceAll(notInAnchor.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n, ok := seen[a]; ok {
			seen[a] = n + 1
			anchors[fmt.Sprintf("%s-%d", a, n+1)] = true
			continue
		}
		seen[a] = 0
		anchors[a] = true
	}
	return anchors
}

// readmeKind is what the runner does with a block.
type readmeKind int

const (
	kindNotRun  readmeKind = iota // not a program
	kindOutput                    // the output of the block before it
	kindSession                   // a console session: commands and their output
	kindShell                     // a shell script
	kindPython                    // a Python program
	kindNode                      // a Node ES module
)

// readmeLanguages maps every fence language a page may use to its kind;
// for kindNotRun, the value's reason is shown when the block is skipped.
var readmeLanguages = map[string]struct {
	kind   readmeKind
	reason string
}{
	"console": {kind: kindSession},
	"sh":      {kind: kindShell},
	"bash":    {kind: kindShell},
	"shell":   {kind: kindShell},
	"python":  {kind: kindPython},
	"py":      {kind: kindPython},
	"js":      {kind: kindNode},
	"mjs":     {kind: kindNode},
	"text":    {kind: kindOutput},
	"yaml":    {kind: kindNotRun, reason: "a yaml file, not a program"},
	"":        {kind: kindNotRun, reason: "no language: text to copy, not a program"},
}

// readmeBlock is one fenced block of a page other than an output block.
type readmeBlock struct {
	line   int    // line number of the opening fence
	lang   string // the fence's info string
	kind   readmeKind
	body   []string // the lines between the fences
	skip   string   // why the block is not run; "" if it is
	output []string // the ```text block after it; nil if none
}

func (b readmeBlock) name() string {
	lang := b.lang
	if lang == "" {
		lang = "plain"
	}
	return fmt.Sprintf("L%d_%s", b.line, lang)
}

var notRunMarker = regexp.MustCompile(`^<!-- not run: (\S.*?) -->$`)

// parseReadme splits a page into its fenced blocks in reading order,
// attaches output blocks and markers to the block they belong to, and
// rejects whatever breaks the convention above.
func parseReadme(r io.Reader) ([]readmeBlock, error) {
	var (
		blocks []readmeBlock
		// open is the block whose fence is open; nil outside a fence.
		open *readmeBlock
		// marker is the reason of a marker not yet followed by its fence,
		// and markerLine its line.
		marker     string
		markerLine int
		// adjacent: only blank lines since the last block closed, so an
		// output block here belongs to it.
		adjacent bool
		// lastOutput: the last block closed was an output block.
		lastOutput bool
	)
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if open != nil {
			if line == "```" {
				if open.kind == kindOutput {
					prev := &blocks[len(blocks)-1]
					prev.output = append([]string{}, open.body...)
					lastOutput = true
				} else {
					blocks = append(blocks, *open)
					lastOutput = false
				}
				open, adjacent = nil, true
				continue
			}
			open.body = append(open.body, line)
			continue
		}
		switch {
		case strings.HasPrefix(line, "```"):
			lang := strings.TrimSpace(strings.TrimPrefix(line, "```"))
			l, ok := readmeLanguages[lang]
			if !ok {
				return nil, fmt.Errorf("line %d: fence language %q is neither run nor known not to be; give it a meaning in readmeLanguages", n, lang)
			}
			b := &readmeBlock{line: n, lang: lang, kind: l.kind}
			switch {
			case l.kind == kindOutput:
				if marker != "" {
					return nil, fmt.Errorf("line %d: a not-run marker before an output block", markerLine)
				}
				if !adjacent || len(blocks) == 0 || lastOutput {
					return nil, fmt.Errorf("line %d: a ```text block holds the output of the block right before it, and there is none", n)
				}
				if blocks[len(blocks)-1].kind == kindSession {
					return nil, fmt.Errorf("line %d: a console session shows its output after each command, not in a ```text block", n)
				}
			case marker != "":
				if l.kind == kindNotRun {
					return nil, fmt.Errorf("line %d: a not-run marker before a %q block, which is not run anyway", markerLine, lang)
				}
				b.skip = "not run: " + marker
			case l.kind == kindNotRun:
				b.skip = l.reason
			}
			marker, open = "", b
		case strings.HasPrefix(strings.TrimLeft(line, " \t>"), "```"), strings.HasPrefix(strings.TrimLeft(line, " \t>"), "~~~"):
			return nil, fmt.Errorf("line %d: a fence is read only as ``` at the start of a line, got %q", n, line)
		case strings.HasPrefix(line, "<!-- not run"):
			m := notRunMarker.FindStringSubmatch(line)
			if m == nil {
				return nil, fmt.Errorf("line %d: a marker is written <!-- not run: reason -->, got %q", n, line)
			}
			if marker != "" {
				return nil, fmt.Errorf("line %d: a second marker before one block", n)
			}
			marker, markerLine = m[1], n
		case strings.TrimSpace(line) != "":
			if marker != "" {
				return nil, fmt.Errorf("line %d: a not-run marker must come right before a fence", markerLine)
			}
			adjacent = false
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if open != nil {
		return nil, fmt.Errorf("line %d: unclosed fence", open.line)
	}
	if marker != "" {
		return nil, fmt.Errorf("line %d: a not-run marker with no block after it", markerLine)
	}
	return blocks, nil
}

// sessionCommand is one "$ " command of a console session.
type sessionCommand struct {
	line int // page line of its "$ "
	cmd  string
	want []string
}

// sessionCommands splits a console block into its commands.
func sessionCommands(b readmeBlock) ([]sessionCommand, error) {
	var cmds []sessionCommand
	continued := false
	for i, line := range b.body {
		n := b.line + 1 + i
		switch {
		case continued:
			c := &cmds[len(cmds)-1]
			c.cmd += "\n" + line
			continued = strings.HasSuffix(line, `\`)
		case strings.HasPrefix(line, "$ "):
			cmd := strings.TrimPrefix(line, "$ ")
			if strings.TrimSpace(cmd) == "" {
				return nil, fmt.Errorf("line %d: an empty command", n)
			}
			cmds = append(cmds, sessionCommand{line: n, cmd: cmd})
			continued = strings.HasSuffix(line, `\`)
		case len(cmds) == 0:
			return nil, fmt.Errorf("line %d: a console session starts with a \"$ \" command, got %q", n, line)
		default:
			c := &cmds[len(cmds)-1]
			c.want = append(c.want, line)
		}
	}
	if len(cmds) == 0 {
		return nil, fmt.Errorf("line %d: a console session without a command", b.line)
	}
	if continued {
		return nil, fmt.Errorf("line %d: the session ends inside a command continued with \\", b.line)
	}
	return cmds, nil
}

// matchOutput lists how the lines got differ from the lines want, by the
// rules above.
func matchOutput(t *testing.T, want, got []string) []string {
	t.Helper()
	var diffs []string
	if len(got) != len(want) {
		diffs = append(diffs, fmt.Sprintf("%d lines, want %d", len(got), len(want)))
	}
	for i := range min(len(got), len(want)) {
		w, g := strings.TrimRight(want[i], " \t"), strings.TrimRight(got[i], " \t")
		switch {
		case strings.Contains(w, "…"):
			parts := strings.Split(w, "…")
			for j := range parts {
				parts[j] = regexp.QuoteMeta(parts[j])
			}
			if !regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(g) {
				diffs = append(diffs, fmt.Sprintf("line %d: %q does not match %q", i+1, g, w))
			}
		case isReplyLine(w):
			rep, err := parseReply(g)
			if err != nil {
				diffs = append(diffs, fmt.Sprintf("line %d: %v, want a reply like %s", i+1, err, w))
				continue
			}
			for _, d := range compareReply(t, w, rep) {
				diffs = append(diffs, fmt.Sprintf("line %d: %s", i+1, d))
			}
		case g != w:
			diffs = append(diffs, fmt.Sprintf("line %d: %q, want %q", i+1, g, w))
		}
	}
	return diffs
}

func isReplyLine(s string) bool {
	if !strings.HasPrefix(s, "{") {
		return false
	}
	_, err := parseReply(s)
	return err == nil
}

// outputLines splits what a program printed into lines.
func outputLines(out string) []string {
	out = strings.TrimSuffix(out, "\n")
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// readmeWorkdir is the directory the pages' examples run in, with the
// environment they run with.
type readmeWorkdir struct {
	dir    string
	env    []string
	python string // the venv's interpreter, where the quotad package is installed
}

// newReadmeWorkdir makes a working directory as a newcomer's checkout
// after `make run` looks to the examples: bin/quotad, and the client
// packages installed as the README says. It lives under the system temp dir so that
// ./quotad.sock stays within the 107 bytes of a socket path.
func newReadmeWorkdir(t *testing.T) readmeWorkdir {
	t.Helper()
	dir, err := os.MkdirTemp("", "readme")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(quotadBin, filepath.Join(bin, "quotad")); err != nil {
		t.Fatal(err)
	}
	python := installPython(t, dir)
	installNode(t, dir)
	return readmeWorkdir{
		dir:    dir,
		env:    cleanEnv("PYTHONDONTWRITEBYTECODE=1"),
		python: python,
	}
}

// run runs a program of an example in the working directory and returns
// what it printed (stdout and stderr as they interleave) and its exit code.
func (w readmeWorkdir) run(t *testing.T, program string, args ...string) (string, int) {
	t.Helper()
	bin, err := exec.LookPath(program)
	if err != nil {
		t.Fatalf("%s runs the examples of README.md and docs/ and is not on PATH (make test-deps installs it): %v", program, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = w.dir
	cmd.Env = w.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s still running after %v:\n%s", program, strings.Join(args, " "), cliTimeout, out.String())
	}
	if err != nil {
		if _, ok := errors.AsType[*exec.ExitError](err); !ok {
			t.Fatalf("run %s: %v", program, err)
		}
	}
	return out.String(), exitCodeOf(err)
}

// runBlock runs one block of page and checks what it printed.
func (w readmeWorkdir) runBlock(t *testing.T, page string, b readmeBlock) {
	t.Helper()
	if b.kind == kindSession {
		cmds, err := sessionCommands(b)
		if err != nil {
			t.Fatalf("%s: %v", page, err)
		}
		for _, c := range cmds {
			out, code := w.run(t, "bash", "-o", "pipefail", "-c", c.cmd)
			if code != 0 {
				t.Errorf("%s:%d: %s\nexit %d:\n%s", page, c.line, c.cmd, code, out)
				continue
			}
			if diffs := matchOutput(t, c.want, outputLines(out)); len(diffs) > 0 {
				t.Errorf("%s:%d: %s\n  %s\ngot:\n%s\nwant:\n%s", page, c.line, c.cmd,
					strings.Join(diffs, "\n  "), out, strings.Join(c.want, "\n"))
			}
		}
		return
	}
	// The example's file is named after its page and line: docs-algorithms-120.py.
	stem := strings.TrimSuffix(pageName(page), ".md")
	program, file, args := "", "", []string(nil)
	switch b.kind {
	case kindShell:
		program, file = "bash", fmt.Sprintf("%s-%d.sh", stem, b.line)
		args = []string{"-e", "-o", "pipefail", file}
	case kindPython:
		program, file = w.python, fmt.Sprintf("%s-%d.py", stem, b.line)
		args = []string{file}
	case kindNode:
		program, file = "node", fmt.Sprintf("%s-%d.mjs", stem, b.line)
		args = []string{file}
	default:
		t.Fatalf("%s:%d: a %q block cannot run", page, b.line, b.lang)
	}
	if err := os.WriteFile(filepath.Join(w.dir, file), []byte(strings.Join(b.body, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := w.run(t, program, args...)
	if code != 0 {
		t.Fatalf("%s:%d: %s %s: exit %d:\n%s", page, b.line, program, b.lang, code, out)
	}
	if diffs := matchOutput(t, b.output, outputLines(out)); len(diffs) > 0 {
		t.Errorf("%s:%d: the %s example printed what the page does not show:\n  %s\ngot:\n%s\nwant:\n%s",
			page, b.line, b.lang, strings.Join(diffs, "\n  "), out, strings.Join(b.output, "\n"))
	}
}

// TestDocsConvention guards the runner itself: what it rejects, what it
// skips, and what its matcher forgives.
func TestDocsConvention(t *testing.T) {
	t.Parallel()
	const fence = "```"
	for _, tc := range []struct{ name, doc, err string }{
		{"unknown language", fence + "ruby\nputs 1\n" + fence + "\n", `"ruby" is neither run nor known`},
		{"unclosed fence", fence + "sh\necho\n", "unclosed fence"},
		{"indented fence", "- a step:\n  " + fence + "sh\n  echo\n  " + fence + "\n", "at the start of a line"},
		{"tilde fence", "~~~sh\necho\n~~~\n", "at the start of a line"},
		{"marker before a block not run anyway", "<!-- not run: x -->\n" + fence + "yaml\na: 1\n" + fence + "\n", "not run anyway"},
		{"marker before prose", "<!-- not run: x -->\nsome text\n" + fence + "sh\necho\n" + fence + "\n", "right before a fence"},
		{"marker at the end", fence + "sh\necho\n" + fence + "\n<!-- not run: x -->\n", "no block after it"},
		{"marker without a reason", "<!-- not run -->\n" + fence + "sh\necho\n" + fence + "\n", "<!-- not run: reason -->"},
		{"two markers", "<!-- not run: x -->\n<!-- not run: y -->\n" + fence + "sh\necho\n" + fence + "\n", "a second marker"},
		{"output block first", fence + "text\nhi\n" + fence + "\n", "there is none"},
		{"output block after prose", fence + "sh\necho hi\n" + fence + "\nIt prints:\n" + fence + "text\nhi\n" + fence + "\n", "there is none"},
		{"two output blocks", fence + "sh\necho hi\n" + fence + "\n" + fence + "text\nhi\n" + fence + "\n" + fence + "text\nhi\n" + fence + "\n", "there is none"},
		{"output block after a session", fence + "console\n$ echo hi\nhi\n" + fence + "\n" + fence + "text\nhi\n" + fence + "\n", "after each command"},
	} {
		if _, err := parseReadme(strings.NewReader(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.err)
		}
	}

	doc := strings.Join([]string{
		"# Title",
		fence + "python", "print('hi')", fence,
		"", fence + "text", "hi", fence,
		"<!-- not run: needs a cluster -->", "", fence + "sh", "kubectl apply -k .", fence,
		fence + "yaml", "a: 1", fence,
		fence + "console", "$ printf '%s\\n' a \\", "    b", "a", "b", "$ true", fence,
		fence + "sh", "true", fence,
		"",
	}, "\n")
	blocks, err := parseReadme(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	type summary struct {
		line   int
		kind   readmeKind
		skip   string
		output string
	}
	var got []summary
	for _, b := range blocks {
		got = append(got, summary{b.line, b.kind, b.skip, strings.Join(b.output, "|")})
	}
	want := []summary{
		{2, kindPython, "", "hi"},
		{11, kindShell, "not run: needs a cluster", ""},
		{14, kindNotRun, "a yaml file, not a program", ""},
		{17, kindSession, "", ""},
		{24, kindShell, "", ""},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("blocks\n  %v\nwant\n  %v", got, want)
	}
	cmds, err := sessionCommands(blocks[3])
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 2 || cmds[0].cmd != "printf '%s\\n' a \\\n    b" || strings.Join(cmds[0].want, "|") != "a|b" ||
		cmds[1].line != 22 || cmds[1].cmd != "true" || cmds[1].want != nil {
		t.Errorf("session commands %+v", cmds)
	}
	if _, err := sessionCommands(readmeBlock{line: 1, body: []string{"output first", "$ true"}}); err == nil {
		t.Error("a session starting with output was accepted")
	}

	anchors := headingAnchors("# Settle: pay for what was used\n## `quotad doctor`\n## Timeouts, the breaker and fail-open/closed\n## A\n## A\n" +
		fence + "sh\n# a comment, not a heading\n" + fence + "\n")
	if want := "[a a-1 quotad-doctor settle-pay-for-what-was-used timeouts-the-breaker-and-fail-openclosed]"; fmt.Sprint(slices.Sorted(maps.Keys(anchors))) != want {
		t.Errorf("heading anchors %v, want %s", slices.Sorted(maps.Keys(anchors)), want)
	}

	const take = `{"ok":true,"allowed":true,"replay":false,"limit":5,"used":1,"remaining":4,"reset_ms":60000,"retry_after_ms":0}`
	for _, tc := range []struct {
		want, got []string
		diffs     int
	}{
		{[]string{"go ahead"}, []string{"go ahead  "}, 0},
		{[]string{"go ahead"}, []string{"go"}, 1},
		{[]string{"go ahead"}, []string{"go ahead", "more"}, 1},
		{nil, []string{"unexpected"}, 1},
		{[]string{`{"ok":true,"version":"…","ready":true}`}, []string{`{"ok":true,"version":"v1.2.3","ready":true}`}, 0},
		{[]string{`{"ok":true,"version":"…","ready":true}`}, []string{`{"ok":true,"version":"v1.2.3","ready":false}`}, 1},
		{[]string{"took … ms"}, []string{"took 12 ms"}, 0},
		{[]string{"took … ms"}, []string{"took 12 s"}, 1},
		{[]string{take}, []string{strings.Replace(take, "60000", "59990", 1)}, 0},
		{[]string{take}, []string{strings.Replace(take, `"used":1`, `"used":2`, 1)}, 1},
		{[]string{take}, []string{"not json"}, 1},
	} {
		if diffs := matchOutput(t, tc.want, tc.got); len(diffs) != tc.diffs {
			t.Errorf("want %q, got %q: %d differences %q, want %d", tc.want, tc.got, len(diffs), diffs, tc.diffs)
		}
	}
}
