package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"quotad/integration/redistest"
)

// The client packages, from the module root.
var (
	pythonPackage = filepath.Join("clients", "python")
	nodePackage   = filepath.Join("clients", "node")
)

// restartTimeout bounds a client test script that runs while its sidecar
// is restarted under it.
const restartTimeout = 3 * cliTimeout

// TestPythonClient installs clients/python into a fresh venv as a user
// would (offline) and runs its unittest suite, its demo, mypy --strict and
// a run across two sidecar restarts, against a real sidecar.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	dir := t.TempDir()
	py := installPython(t, dir)
	src := filepath.Join(dir, "python-src") // the copy installPython installed from
	env := cleanEnv("QUOTAD_TEST_SOCKET="+sc.socket, "QUOTAD_TEST_SUBJECT=py-"+filepath.Base(dir))

	where := run(t, dir, cleanEnv(), cliTimeout, py, "-c", "import quotad; print(quotad.__file__)")
	if !strings.HasPrefix(strings.TrimSpace(where), filepath.Join(dir, "venv")) {
		t.Fatalf("import quotad found %s, want the copy installed in the venv", where)
	}

	t.Run("unittest", func(t *testing.T) {
		out := run(t, dir, env, cliTimeout, py, "-m", "unittest", "discover", "-v", "-s", filepath.Join(src, "tests"))
		logFigures(t, out)
		if !strings.Contains(out, "python threads") || !strings.Contains(out, "python asyncio") {
			t.Fatalf("the unittest run printed no figures:\n%s", out)
		}
	})
	t.Run("demo", func(t *testing.T) {
		out := run(t, dir, cleanEnv(), cliTimeout, py, filepath.Join(src, "demo.py"), sc.socket, "demo-py")
		wantDemo(t, out)
	})
	t.Run("mypy", func(t *testing.T) {
		mypy, err := exec.LookPath("mypy")
		if err != nil {
			t.Fatalf("mypy is required and not on PATH (make test-deps installs Debian's mypy): %v", err)
		}
		out := run(t, src, cleanEnv("MYPYPATH="+filepath.Join(src, "src")), cliTimeout, mypy, "--strict",
			"--cache-dir", filepath.Join(dir, "mypy-cache"), filepath.Join("src", "quotad"), "tests", "demo.py")
		t.Log(strings.TrimSpace(out))
	})
	t.Run("restart", func(t *testing.T) {
		out := runAcrossRestarts(t, r, sc, 2, dir, env, py, filepath.Join(src, "tests", "restart.py"), "2")
		if !strings.Contains(out, `"figures":"python restart"`) {
			t.Fatalf("the restart run printed no figures:\n%s", out)
		}
	})
	assertKeysHaveTTL(t, r, sc.prefix)
}

// TestNodeClient installs clients/node with npm as a user would and runs
// its node:test suite, its demo, tsc --noEmit over a TypeScript file using
// the declarations, and a run across two sidecar restarts.
func TestNodeClient(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	dir := t.TempDir()
	installNode(t, dir)
	node := lookPath(t, "node")
	copyTree(t, filepath.Join(moduleRoot, nodePackage, "test"), dir)
	copyTree(t, filepath.Join(moduleRoot, nodePackage, "demo.mjs"), filepath.Join(dir, "demo.mjs"))
	env := cleanEnv("QUOTAD_TEST_SOCKET="+sc.socket, "QUOTAD_TEST_SUBJECT=js-"+filepath.Base(dir))

	t.Run("node-test", func(t *testing.T) {
		out := run(t, dir, env, cliTimeout, node, "--test", "--test-reporter=spec", "client.test.mjs")
		logFigures(t, out)
		if !strings.Contains(out, "node workers") || !strings.Contains(out, "node concurrent") {
			t.Fatalf("the node test run printed no figures:\n%s", out)
		}
	})
	t.Run("demo", func(t *testing.T) {
		out := run(t, dir, cleanEnv(), cliTimeout, node, "demo.mjs", sc.socket, "demo-js")
		wantDemo(t, out)
	})
	t.Run("tsc", func(t *testing.T) {
		tsc := typescript(t)
		out := run(t, dir, cleanEnv(), cliTimeout, node, tsc, "--noEmit", "--strict", "--target", "es2022",
			"--module", "nodenext", "--moduleResolution", "nodenext", "types.ts")
		t.Log("tsc --noEmit --strict types.ts: no errors", strings.TrimSpace(out))
	})
	t.Run("opentelemetry", func(t *testing.T) {
		// An application with @opentelemetry/api: the client sends its
		// active span. The suite above ran without it.
		otelDir := t.TempDir()
		installNode(t, otelDir)
		api := filepath.Join(npmCached(t, "@opentelemetry/api", otelAPIVersion), "node_modules", "@opentelemetry", "api")
		if err := os.Symlink(api, filepath.Join(mkdirAll(t, filepath.Join(otelDir, "node_modules", "@opentelemetry", "api")))); err != nil {
			t.Fatal(err)
		}
		copyTree(t, filepath.Join(moduleRoot, nodePackage, "test"), otelDir)
		out := run(t, otelDir, env, cliTimeout, node, "--test", "--test-reporter=spec", "otel.mjs")
		if !strings.Contains(out, "a call sends the active span") {
			t.Fatalf("the opentelemetry test did not run:\n%s", out)
		}
	})
	t.Run("restart", func(t *testing.T) {
		out := runAcrossRestarts(t, r, sc, 2, dir, env, node, "restart.mjs", "2")
		if !strings.Contains(out, `"figures":"node restart"`) {
			t.Fatalf("the restart run printed no figures:\n%s", out)
		}
	})
	assertKeysHaveTTL(t, r, sc.prefix)
}

// wantDemo checks a demo's output: it exits 0 only when every step held;
// this makes sure the steps ran.
func wantDemo(t *testing.T, out string) {
	t.Helper()
	for _, step := range []string{`"step":"take"`, `"step":"conflict"`, `"step":"release"`, `"step":"invalid"`, `"step":"unknown option"`} {
		if !strings.Contains(out, step) {
			t.Fatalf("the demo printed no %s step:\n%s", step, out)
		}
	}
}

// logFigures logs the {"figures": ...} lines a client test printed.
func logFigures(t *testing.T, out string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, `{"figures"`); i >= 0 {
			t.Log(line[i:])
		}
	}
}

// runAcrossRestarts runs a client script that prints "restart N" when it
// wants its sidecar restarted and then reads "restarted" from stdin.
// Round 1 kills the sidecar with SIGKILL, later rounds drain it with
// SIGTERM; each time a new sidecar takes over the same socket and key
// prefix. It returns what the script printed; a non-zero exit fails.
func runAcrossRestarts(t *testing.T, r *redistest.Server, sc *sidecarProc, rounds int, dir string, env []string, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), restartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	var out strings.Builder
	cur := sc
	restarted := 0
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		line := lines.Text()
		out.WriteString(line + "\n")
		if !strings.HasPrefix(line, "restart ") {
			continue
		}
		restarted++
		if restarted == 1 {
			cur.wantStatus = -1 // killed by a signal
			if err := cur.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		} else {
			cur.signal(t, syscall.SIGTERM)
		}
		cur.wait(t)
		next := launchSidecar(t, sc.socket, r.URL(), "--key-prefix", sc.prefix)
		next.prefix = sc.prefix
		next.waitReady(t)
		cur = next
		if _, err := io.WriteString(stdin, "restarted\n"); err != nil {
			t.Fatalf("tell the script the sidecar restarted: %v", err)
		}
	}
	stdin.Close()
	err = cmd.Wait()
	logFigures(t, out.String())
	if err != nil {
		t.Fatalf("%s %s: %v (timed out: %v)\nstdout:\n%s\nstderr:\n%s", bin, strings.Join(args, " "), err, ctx.Err() != nil, out.String(), stderr.String())
	}
	if restarted != rounds {
		t.Fatalf("the script asked for %d restarts, want %d:\n%s", restarted, rounds, out.String())
	}
	return out.String()
}

// installPython copies clients/python to dir/python-src and installs it
// into a fresh venv at dir/venv the way its README says, offline: pip
// --no-index --no-build-isolation, with the wheel package (which
// setuptools before 70.1 needs to build a wheel) from Debian's
// python3-wheel-whl. It returns the venv's python.
func installPython(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join(dir, "python-src")
	copyTree(t, filepath.Join(moduleRoot, pythonPackage), src)
	venv := filepath.Join(dir, "venv")
	run(t, dir, cleanEnv(), cliTimeout, lookPath(t, "python3"), "-m", "venv", venv)
	wheels, _ := filepath.Glob("/usr/share/python-wheels/wheel-*.whl")
	if len(wheels) == 0 {
		t.Fatal("no /usr/share/python-wheels/wheel-*.whl: make test-deps installs python3-wheel-whl")
	}
	pip := filepath.Join(venv, "bin", "pip")
	run(t, dir, cleanEnv(), cliTimeout, pip, "install", "--quiet", "--no-index", wheels[0])
	run(t, dir, cleanEnv(), cliTimeout, pip, "install", "--quiet", "--no-index", "--no-build-isolation", src)
	return filepath.Join(venv, "bin", "python")
}

// installNode installs clients/node into dir/node_modules with npm, as a
// packed copy (--install-links) rather than a link to the source, so the
// package's "files" are what gets tested.
func installNode(t *testing.T, dir string) {
	t.Helper()
	src := filepath.Join(dir, "node-src")
	copyTree(t, filepath.Join(moduleRoot, nodePackage), src)
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"quotad-test","private":true,"type":"module"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, cleanEnv(), cliTimeout, lookPath(t, "npm"), "install", "--no-audit", "--no-fund", "--install-links", src)
	if !fileExists(filepath.Join(dir, "node_modules", "quotad", "index.d.ts")) {
		t.Fatal("npm install left no node_modules/quotad/index.d.ts")
	}
}

// otelAPIVersion is the @opentelemetry/api the Node client's test of an
// application that traces installs.
const otelAPIVersion = "1.10.0"

// typescriptVersion is the compiler the Node client's declarations are
// checked with.
const typescriptVersion = "5.9.3"

// typescript returns the path of tsc's script, installing typescript with
// npm into $HOME/.cache/quotad-test once. A failed install fails the test.
func typescript(t *testing.T) string {
	t.Helper()
	return filepath.Join(npmCached(t, "typescript", typescriptVersion), "node_modules", "typescript", "bin", "tsc")
}

// npmCached installs the npm package name@version into its own directory
// under $HOME/.cache/quotad-test once, and returns that directory (its
// node_modules holds the package). A failed install fails the test: a
// tool the tests need is never silently left out.
func npmCached(t *testing.T, name, version string) string {
	t.Helper()
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatalf("no home directory for the %s cache: %v", name, err)
	}
	dirName := strings.ReplaceAll(name, "/", "+") // a scoped package, @scope/name
	cache := filepath.Join(home, ".cache", "quotad-test", dirName+"-"+version)
	pkg := filepath.Join(cache, "node_modules", name, "package.json")
	if fileExists(pkg) {
		return cache
	}
	// Install next to the cache and rename into place, so an interrupted
	// install is never taken for a finished one.
	tmp, err := os.MkdirTemp(filepath.Dir(mkdirAll(t, cache)), dirName+"-install")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	run(t, tmp, cleanEnv(), 3*cliTimeout, lookPath(t, "npm"), "install", "--no-audit", "--no-fund", "--prefix", tmp, name+"@"+version)
	if err := os.Rename(tmp, cache); err != nil && !fileExists(pkg) {
		t.Fatalf("install %s into %s: %v", name, cache, err)
	}
	return cache
}

func mkdirAll(t *testing.T, path string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// copyTree copies the file or directory src to dst, leaving out build
// output and installed dependencies.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	skip := map[string]bool{"build": true, "node_modules": true, "__pycache__": true, ".mypy_cache": true}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip[d.Name()] || strings.HasSuffix(d.Name(), ".egg-info") {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}

func lookPath(t *testing.T, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is required for the client tests and is not on PATH (make test-deps installs it): %v", name, err)
	}
	return bin
}

// run runs bin in dir and returns its combined output; a non-zero exit
// or a timeout fails the test.
func run(t *testing.T, dir string, env []string, timeout time.Duration, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v (timed out: %v)\n%s", bin, strings.Join(args, " "), err, ctx.Err() != nil, out.String())
	}
	return out.String()
}

// TestClientReadmeExamples runs every ```python block of
// clients/python/README.md and every ```mjs block of clients/node/README.md,
// in order, with the package installed and the socket at ./quotad.sock.
func TestClientReadmeExamples(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := startSidecar(t, r.URL())
	for _, tc := range []struct{ pkg, fence, ext string }{
		{pythonPackage, "python", ".py"},
		{nodePackage, "mjs", ".mjs"},
	} {
		t.Run(tc.fence, func(t *testing.T) {
			readme, err := os.ReadFile(filepath.Join(moduleRoot, tc.pkg, "README.md"))
			if err != nil {
				t.Fatal(err)
			}
			blocks := regexp.MustCompile("(?s)```"+tc.fence+"\n(.*?)```").FindAllSubmatch(readme, -1)
			if len(blocks) == 0 {
				t.Fatalf("%s/README.md has no ```%s example", tc.pkg, tc.fence)
			}
			dir := t.TempDir()
			var bin string
			if tc.pkg == pythonPackage {
				bin = installPython(t, dir)
			} else {
				installNode(t, dir)
				bin = lookPath(t, "node")
			}
			if err := os.Symlink(sc.socket, filepath.Join(dir, "quotad.sock")); err != nil {
				t.Fatal(err)
			}
			for i, b := range blocks {
				file := "example" + strconv.Itoa(i) + tc.ext
				if err := os.WriteFile(filepath.Join(dir, file), b[1], 0o644); err != nil {
					t.Fatal(err)
				}
				out := run(t, dir, cleanEnv(), cliTimeout, bin, file)
				if strings.TrimSpace(out) == "" {
					t.Fatalf("%s/README.md example %d printed nothing", tc.pkg, i)
				}
				t.Logf("%s example %d: %s", tc.fence, i, strings.TrimSpace(strings.SplitN(out, "\n", 2)[0]))
			}
		})
	}
	assertKeysHaveTTL(t, r, sc.prefix)
}
