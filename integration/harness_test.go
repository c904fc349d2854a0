// Package integration_test runs the real quotad binary against a real
// redis-server and talks to it the way applications do: through the CLI,
// over the socket line by line, and from the Python and Node clients.
package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"quotad/integration/redistest"
)

// Deadlines of the harness. They bound waits for events that normally take
// milliseconds; they are generous so a loaded 2-core machine does not flake,
// and they are never used to assert how fast something is.
const (
	readyTimeout = 20 * time.Second // a sidecar's start and first Redis connection
	replyTimeout = 20 * time.Second // one reply line
	stopTimeout  = 20 * time.Second // a drain after SIGTERM, before SIGKILL
	pollTimeout  = 20 * time.Second // any other condition polled by eventually
	cliTimeout   = 60 * time.Second // one run of a client subcommand or script
	pollInterval = 10 * time.Millisecond
)

var (
	// moduleRoot is the repository root: PROTOCOL.md and the client scripts
	// are found from it.
	moduleRoot string
	// quotadBin is the binary under test, built once by TestMain.
	quotadBin string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "quotad-integration")
	if err != nil {
		fmt.Fprintln(os.Stderr, "make a directory for the quotad binary:", err)
		os.Exit(1)
	}
	if err := buildQuotad(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}

// buildQuotad builds the module's main package into dir. With -race the
// sidecar gets the race detector too, and a race it finds fails the test
// through its exit status.
func buildQuotad(dir string) error {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return errors.New("go env GOMOD: not inside the quotad module")
	}
	moduleRoot = filepath.Dir(gomod)
	quotadBin = filepath.Join(dir, "quotad")
	args := []string{"build", "-o", quotadBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "quotad")...)
	cmd.Dir = moduleRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build quotad: %w\n%s", err, out)
	}
	return nil
}

// cleanEnv is the environment of every process the tests start, without
// QUOTAD_* variables: flags alone configure what a test runs. A race-enabled
// binary sleeps a second at exit by default to catch late reports; a tenth
// of that keeps the suite quick, unless GORACE is set already.
func cleanEnv(extra ...string) []string {
	var env []string
	gorace := false
	for _, kv := range os.Environ() {
		gorace = gorace || strings.HasPrefix(kv, "GORACE=")
		if !strings.HasPrefix(kv, "QUOTAD_") {
			env = append(env, kv)
		}
	}
	if raceEnabled && !gorace {
		env = append(env, "GORACE=atexit_sleep_ms=100")
	}
	return append(env, extra...)
}

var prefixSeq atomic.Int64

var unsafePrefixChars = regexp.MustCompile(`[^A-Za-z0-9_/-]+`)

// keyPrefix is a --key-prefix no other sidecar of this run shares.
func keyPrefix(t testing.TB) string {
	return fmt.Sprintf("it:%s:%d:", unsafePrefixChars.ReplaceAllString(t.Name(), "_"), prefixSeq.Add(1))
}

// socketPath is a path for a socket in a fresh directory under the system
// temp dir: t.TempDir() holds the test name and can exceed the 107 bytes a
// Unix socket path allows.
func socketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qd")
	if err != nil {
		t.Fatalf("make a socket directory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "q.sock")
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// sidecarProc is one `quotad serve` process owned by a test.
type sidecarProc struct {
	socket string
	prefix string
	cmd    *exec.Cmd
	out    syncBuffer    // stdout and stderr: the JSON log
	done   chan struct{} // closed once the process has exited
	err    error         // cmd.Wait's result, valid after done
	// stopping is set once the test sent SIGTERM itself: the cleanup then
	// only waits, since a second signal forces an exit.
	stopping atomic.Bool
	// wantStatus is the exit status the cleanup expects: 0 unless a test
	// stops the sidecar in a way that is documented to exit otherwise.
	wantStatus int
}

// startSidecar runs `quotad serve` on a fresh socket with a fresh key prefix
// and JSON logs, and returns once it answers a ping with Redis reachable.
// redisURL "" runs the embedded store. The process gets SIGTERM when the
// test ends and must exit 0; its log is shown if the test failed.
func startSidecar(t *testing.T, redisURL string, extraArgs ...string) *sidecarProc {
	t.Helper()
	p := launchSidecar(t, socketPath(t), redisURL, extraArgs...)
	p.waitReady(t)
	return p
}

// launchSidecar starts `quotad serve` on socket without waiting for it.
func launchSidecar(t *testing.T, socket, redisURL string, extraArgs ...string) *sidecarProc {
	t.Helper()
	return launchSidecarEnv(t, socket, redisURL, nil, extraArgs...)
}

// launchSidecarEnv is launchSidecar with extra environment variables.
func launchSidecarEnv(t *testing.T, socket, redisURL string, env []string, extraArgs ...string) *sidecarProc {
	t.Helper()
	p := &sidecarProc{socket: socket, prefix: keyPrefix(t), done: make(chan struct{})}
	args := []string{"serve", "--socket", socket, "--key-prefix", p.prefix, "--log-format", "json"}
	if redisURL != "" {
		args = append(args, "--redis-url", redisURL)
	}
	p.cmd = exec.Command(quotadBin, append(args, extraArgs...)...)
	p.cmd.Env = cleanEnv(env...)
	p.cmd.Stdout = &p.out
	p.cmd.Stderr = &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start quotad serve: %v", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("log of the sidecar on %s:\n%s", socket, p.out.String())
		}
	})
	return p
}

// waitReady polls with a ping until the sidecar answers with redis_ok, so
// that the first request of a test is never refused for want of a
// connection to Redis.
func (p *sidecarProc) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	var last error
	for {
		if p.exited() {
			t.Fatalf("quotad serve exited before answering (%v):\n%s", p.err, p.out.String())
		}
		if last = p.pingReady(); last == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("quotad serve on %s not ready within %v: %v\n%s", p.socket, readyTimeout, last, p.out.String())
		}
		time.Sleep(pollInterval)
	}
}

func (p *sidecarProc) pingReady() error {
	nc, err := net.DialTimeout("unix", p.socket, time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write([]byte(`{"op":"ping"}` + "\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil {
		return err
	}
	r, err := parseReply(line)
	if err != nil {
		return err
	}
	if ok, _ := r.fields["redis_ok"].(bool); !r.ok() || !ok {
		return fmt.Errorf("ping: %s", r)
	}
	return nil
}

func (p *sidecarProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the sidecar.
func (p *sidecarProc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if sig == syscall.SIGTERM || sig == os.Interrupt {
		p.stopping.Store(true)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to quotad: %v", sig, err)
	}
}

// wait waits for the sidecar to exit and returns its exit code; a sidecar
// still running after stopTimeout fails the test.
func (p *sidecarProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		t.Fatalf("quotad serve still running %v after it was told to stop:\n%s", stopTimeout, p.out.String())
	}
	return exitCodeOf(p.err)
}

// stop ends the sidecar with SIGTERM (SIGKILL after stopTimeout) unless it
// already exited, and reports an exit status other than 0: every way the
// tests stop a sidecar is a clean shutdown, and a race detected in it makes
// the status non-zero.
func (p *sidecarProc) stop(t *testing.T) {
	t.Helper()
	if !p.exited() {
		if !p.stopping.Load() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Errorf("quotad serve on %s still running %v after SIGTERM; killed", p.socket, stopTimeout)
			return
		}
	}
	if code := exitCodeOf(p.err); code != p.wantStatus {
		t.Errorf("quotad serve on %s exited with %v, want status %d", p.socket, p.err, p.wantStatus)
	}
	if strings.Contains(p.out.String(), "WARNING: DATA RACE") {
		t.Errorf("the race detector reported a data race in quotad serve")
	}
}

func exitCodeOf(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.ExitCode()
	}
	return -1
}

// logLine is one line of the sidecar's JSON log.
type logLine map[string]any

func (l logLine) str(key string) string {
	s, _ := l[key].(string)
	return s
}

// logLines parses the sidecar's log so far; lines that are not JSON (a race
// report, say) are left out.
func (p *sidecarProc) logLines() []logLine {
	var lines []logLine
	for _, s := range strings.Split(p.out.String(), "\n") {
		var l logLine
		if json.Unmarshal([]byte(s), &l) == nil {
			lines = append(lines, l)
		}
	}
	return lines
}

// waitLog waits until the log holds a line of the given level whose message
// contains msg, and returns it. Replies can overtake the log line written
// before them, so a test polls rather than reads once.
func (p *sidecarProc) waitLog(t *testing.T, level, msg string) logLine {
	t.Helper()
	var found logLine
	eventually(t, fmt.Sprintf("a %s log line %q", level, msg), func() bool {
		found = p.findLog(level, msg)
		return found != nil
	})
	return found
}

func (p *sidecarProc) findLog(level, msg string) logLine {
	for _, l := range p.logLines() {
		if l.str("level") == level && strings.Contains(l.str("msg"), msg) {
			return l
		}
	}
	return nil
}

// eventually polls cond until it holds; after pollTimeout the test fails.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pollTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", pollTimeout, what)
		}
		time.Sleep(pollInterval)
	}
}

// cli runs the quotad binary with args and returns what it printed and its
// exit code.
func cli(t *testing.T, args ...string) (stdout, stderr string, exitCode int) {
	t.Helper()
	return cliEnv(t, nil, args...)
}

// cliEnv is cli with extra environment variables ("KEY=value").
func cliEnv(t *testing.T, env []string, args ...string) (stdout, stderr string, exitCode int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, quotadBin, args...)
	cmd.Env = cleanEnv(env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("quotad %s still running after %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), cliTimeout, o.String(), e.String())
	}
	if err != nil {
		if _, ok := errors.AsType[*exec.ExitError](err); !ok {
			t.Fatalf("run quotad %s: %v", strings.Join(args, " "), err)
		}
	}
	return o.String(), e.String(), exitCodeOf(err)
}

// cli runs a client subcommand (take, peek, ping) against this sidecar.
func (p *sidecarProc) cli(t *testing.T, subcommand string, args ...string) (stdout, stderr string, exitCode int) {
	t.Helper()
	return cli(t, append([]string{subcommand, "--socket", p.socket}, args...)...)
}

// reply is one decoded reply line; numbers stay json.Number so integers
// compare exactly.
type reply struct {
	raw    string
	fields map[string]any
}

func (r reply) String() string { return r.raw }

func (r reply) ok() bool {
	b, _ := r.fields["ok"].(bool)
	return b
}

func (r reply) code() string {
	s, _ := r.fields["error"].(string)
	return s
}

func (r reply) num(t testing.TB, key string) int64 {
	t.Helper()
	n, ok := r.fields[key].(json.Number)
	if !ok {
		t.Fatalf("reply %s: %q is not a number", r, key)
	}
	v, err := n.Int64()
	if err != nil {
		t.Fatalf("reply %s: %q is not an integer", r, key)
	}
	return v
}

func (r reply) flag(t testing.TB, key string) bool {
	t.Helper()
	b, ok := r.fields[key].(bool)
	if !ok {
		t.Fatalf("reply %s: %q is not a boolean", r, key)
	}
	return b
}

func (r reply) str(t testing.TB, key string) string {
	t.Helper()
	s, ok := r.fields[key].(string)
	if !ok {
		t.Fatalf("reply %s: %q is not a string", r, key)
	}
	return s
}

// parseReply decodes one reply line, which must be exactly one JSON object.
func parseReply(line string) (reply, error) {
	line = strings.TrimSuffix(line, "\n")
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return reply{}, fmt.Errorf("reply %q is not a JSON object: %w", line, err)
	}
	if dec.More() {
		return reply{}, fmt.Errorf("reply %q holds more than one JSON value", line)
	}
	if _, ok := m["ok"].(bool); !ok {
		return reply{}, fmt.Errorf("reply %q has no boolean ok", line)
	}
	return reply{raw: line, fields: m}, nil
}

// mustParse decodes the single reply line a CLI run printed.
func mustParse(t testing.TB, stdout string) reply {
	t.Helper()
	if strings.Count(stdout, "\n") != 1 || !strings.HasSuffix(stdout, "\n") {
		t.Fatalf("want exactly one reply line, got %q", stdout)
	}
	r, err := parseReply(stdout)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wantTake checks an ok take reply against a limit.
func wantTake(t testing.TB, r reply, allowed, replay bool, limit, used int64) {
	t.Helper()
	if !r.ok() || r.flag(t, "allowed") != allowed || r.flag(t, "replay") != replay ||
		r.num(t, "limit") != limit || r.num(t, "used") != used || r.num(t, "remaining") != max(limit-used, 0) {
		t.Fatalf("got %s\nwant ok, allowed %v, replay %v, limit %d, used %d, remaining %d", r, allowed, replay, limit, used, max(limit-used, 0))
	}
	retry := r.num(t, "retry_after_ms")
	if allowed && retry != 0 || !allowed && retry < 1 {
		t.Fatalf("got %s: retry_after_ms must be 0 when allowed and positive when denied", r)
	}
}

// wantPeek checks an ok peek reply.
func wantPeek(t testing.TB, r reply, limit, used int64) {
	t.Helper()
	if !r.ok() || r.num(t, "limit") != limit || r.num(t, "used") != used || r.num(t, "remaining") != max(limit-used, 0) {
		t.Fatalf("got %s\nwant ok, limit %d, used %d, remaining %d", r, limit, used, max(limit-used, 0))
	}
}

// wantError checks an error reply's code and that it carries a message.
func wantError(t testing.TB, r reply, code string) {
	t.Helper()
	if r.ok() || r.code() != code {
		t.Fatalf("got %s, want error %s", r, code)
	}
	if msg, _ := r.fields["message"].(string); msg == "" {
		t.Fatalf("got %s: an error reply needs a message", r)
	}
}

// wantResetWithin checks 1 <= reset_ms <= windowMS: the window is live and
// ends no later than windowMS after it opened.
func wantResetWithin(t testing.TB, r reply, windowMS int64) {
	t.Helper()
	if ms := r.num(t, "reset_ms"); ms < 1 || ms > windowMS {
		t.Fatalf("got %s: reset_ms must be in 1..%d", r, windowMS)
	}
}

// lineConn is a raw protocol connection: it writes lines and reads replies
// with deadlines. Its methods fail the test and so belong to the test's
// goroutine; other goroutines use roundTrip.
type lineConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

// dial opens a connection to the sidecar, closed when the test ends.
func (p *sidecarProc) dial(t *testing.T) *lineConn {
	t.Helper()
	c, err := dialLines(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	c.t = t
	t.Cleanup(func() { c.nc.Close() })
	return c
}

func dialLines(socket string) (*lineConn, error) {
	nc, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", socket, err)
	}
	return &lineConn{nc: nc, br: bufio.NewReader(nc)}, nil
}

// send writes each line followed by '\n', all in one write.
func (c *lineConn) send(lines ...string) {
	c.t.Helper()
	var b []byte
	for _, l := range lines {
		b = append(append(b, l...), '\n')
	}
	c.write(b)
}

// write writes b as it is, in one write.
func (c *lineConn) write(b []byte) {
	c.t.Helper()
	if err := c.writeErr(b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *lineConn) writeErr(b []byte) error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(replyTimeout))
	if _, err := c.nc.Write(b); err != nil {
		return fmt.Errorf("write %d bytes: %w", len(b), err)
	}
	return nil
}

// read reads one reply line.
func (c *lineConn) read() reply {
	c.t.Helper()
	r, err := c.readErr()
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

func (c *lineConn) readErr() (reply, error) {
	line, err := c.readLine()
	if err != nil {
		return reply{}, err
	}
	return parseReply(line)
}

func (c *lineConn) readLine() (string, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(replyTimeout))
	line, err := c.br.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read a reply line (got %q): %w", line, err)
	}
	return line, nil
}

// do sends one line and reads its reply.
func (c *lineConn) do(line string) reply {
	c.t.Helper()
	c.send(line)
	return c.read()
}

// call sends req as JSON and reads its reply.
func (c *lineConn) call(req map[string]any) reply {
	c.t.Helper()
	return c.do(mustJSON(c.t, req))
}

// roundTrip sends one line and reads its reply without touching the test.
func (c *lineConn) roundTrip(line string) (reply, error) {
	if err := c.writeErr([]byte(line + "\n")); err != nil {
		return reply{}, err
	}
	return c.readErr()
}

// ping checks that the connection still answers in order: the next reply
// must be this ping's.
func (c *lineConn) ping(id string) {
	c.t.Helper()
	r := c.do(`{"op":"ping","id":"` + id + `"}`)
	if !r.ok() || r.fields["id"] != id {
		c.t.Fatalf("ping %q: got %s", id, r)
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode %v: %v", v, err)
	}
	return string(b)
}

// takeReq and peekReq build inline requests; extra fields are merged in.
func takeReq(subject string, limit, windowMS int64, extra ...any) map[string]any {
	return withFields(map[string]any{"op": "take", "subject": subject, "limit": limit, "window_ms": windowMS}, extra)
}

func peekReq(subject string, limit, windowMS int64, extra ...any) map[string]any {
	return withFields(map[string]any{"op": "peek", "subject": subject, "limit": limit, "window_ms": windowMS}, extra)
}

func withFields(m map[string]any, kv []any) map[string]any {
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// Redis helpers. Each fails the test on an error reply.

func redisInt(t testing.TB, r *redistest.Server, args ...string) int64 {
	t.Helper()
	n, err := r.Do(t, args...).AsInt64()
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	return n
}

func redisString(t testing.TB, r *redistest.Server, args ...string) string {
	t.Helper()
	s, err := r.Do(t, args...).ToString()
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	return s
}

func redisOK(t testing.TB, r *redistest.Server, args ...string) {
	t.Helper()
	if err := r.Do(t, args...).Error(); err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
}

var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)

// scanKeys lists the keys under prefix with SCAN, as an operator would.
func scanKeys(t testing.TB, r *redistest.Server, prefix string) []string {
	t.Helper()
	var keys []string
	cursor := "0"
	for {
		v, err := r.Do(t, "SCAN", cursor, "MATCH", globEscaper.Replace(prefix)+"*", "COUNT", "1000").ToArray()
		if err != nil || len(v) != 2 {
			t.Fatalf("scan %q: %v", prefix, err)
		}
		if cursor, err = v[0].ToString(); err != nil {
			t.Fatalf("scan cursor: %v", err)
		}
		page, err := v[1].AsStrSlice()
		if err != nil {
			t.Fatalf("scan keys: %v", err)
		}
		keys = append(keys, page...)
		if cursor == "0" {
			return keys
		}
	}
}

// assertKeysHaveTTL ends every test that wrote to Redis: no key quotad
// wrote may be left without an expiry.
func assertKeysHaveTTL(t *testing.T, r *redistest.Server, prefix string) {
	t.Helper()
	redistest.AssertAllKeysHaveTTL(t, r.Client(t), prefix)
}

// waitBlockedScript waits until Redis holds a script call that is blocked,
// as CLIENT PAUSE WRITE blocks EVAL and EVALSHA: the request is in flight
// and cannot finish before the pause ends.
func waitBlockedScript(t *testing.T, r *redistest.Server) {
	t.Helper()
	eventually(t, "a script call blocked in Redis", func() bool { return scriptBlocked(t, r) })
}

// scriptBlocked reports whether a client of Redis is blocked in a script
// call.
func scriptBlocked(t *testing.T, r *redistest.Server) bool {
	t.Helper()
	list := redisString(t, r, "CLIENT", "LIST")
	for _, c := range strings.Split(list, "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(c) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		if strings.Contains(f["flags"], "b") && (f["cmd"] == "evalsha" || f["cmd"] == "eval") {
			return true
		}
	}
	return false
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
