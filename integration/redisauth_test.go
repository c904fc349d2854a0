package integration_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
)

func TestTLSWithCAFile(t *testing.T) {
	certs := redistest.NewCerts(t)
	r := redistest.Start(t, redistest.WithTLS(certs))
	for name, p := range map[string]*sidecarProc{
		"flag": startSidecar(t, r.TLSURL(), "--redis-ca-file", certs.CAFile),
		"env":  launchSidecarEnv(t, socketPath(t), r.TLSURL(), []string{"QUOTAD_REDIS_CA_FILE=" + certs.CAFile}),
	} {
		p.waitReady(t)
		wantTake(t, p.dial(t).call(takeReq("alice", 3, 60000)), true, false, 3, 1)
		if n := redisInt(t, r, "EXISTS", inlineKey(p.prefix, "alice")); n != 1 {
			t.Errorf("%s: the take over TLS did not reach redis", name)
		}
	}
}

func TestTLSBadCertificateIsReported(t *testing.T) {
	r := redistest.Start(t, redistest.WithTLS(redistest.NewCerts(t)))
	otherCA := redistest.NewCerts(t).CAFile
	p := launchSidecar(t, socketPath(t), r.TLSURL(), "--redis-ca-file", otherCA)
	const why = "redis's TLS certificate is not trusted (check --redis-ca-file"
	var last reply
	eventually(t, "a take to say why redis is unreachable", func() bool {
		c, err := dialLines(p.socket)
		if err != nil {
			return false
		}
		defer c.nc.Close()
		last, err = c.roundTrip(mustJSON(t, takeReq("alice", 3, 60000)))
		return err == nil && strings.Contains(last.raw, why)
	})
	wantError(t, last, "UNAVAILABLE")
	stdout, _, code := p.cli(t, "ping", "--redis")
	ping := mustParse(t, stdout)
	// Ready (it answers), but ping --redis exits 1 and says why.
	if code != 1 || ping.flag(t, "redis_ok") || !ping.flag(t, "ready") || strings.Count(ping.str(t, "redis_error"), why) != 1 {
		t.Errorf("quotad ping --redis exited %d with %s; want exit 1, redis_ok false, ready true, and redis_error saying %q once", code, stdout, why)
	}
	l := p.waitLog(t, "warn", "cannot connect to redis, retrying")
	if !strings.Contains(l.str("error"), why) || !strings.Contains(l.str("error"), "x509") {
		t.Errorf("log line %v does not say the certificate is not trusted", l)
	}
}

// readmeACL is the ACL line docs/redis.md documents for the sidecar, with
// the key pattern and password put in.
func readmeACL(t *testing.T, keyPattern, password string) []string {
	t.Helper()
	return readmeACLFor(t, "quotad", keyPattern, password)
}

// readmeACLFor is readmeACL for the documented line of another user (the
// doctor's is in docs/operations.md). The line is looked for in README.md
// and every page of docs/, and must be written once.
func readmeACLFor(t *testing.T, user, keyPattern, password string) []string {
	t.Helper()
	var found []string
	var where []string
	for _, page := range docPages(t) {
		b, err := os.ReadFile(filepath.Join(moduleRoot, filepath.FromSlash(page)))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "ACL SETUSER "+user+" ") {
				found = strings.Fields(line)
				where = append(where, page)
			}
		}
	}
	switch len(where) {
	case 0:
		t.Fatalf("README.md and docs/ document no line starting with ACL SETUSER %s", user)
	case 1:
	default:
		t.Fatalf("the ACL SETUSER %s line is documented %d times (%s); one place keeps it true", user, len(where), strings.Join(where, ", "))
	}
	for i, a := range found {
		switch a {
		case "~quotad:*":
			found[i] = "~" + keyPattern
		case ">CHANGE-ME":
			found[i] = ">" + password
		}
	}
	return found
}

const aclPassword = "Quotad-ACL-pw-4711"

// startACLRedis starts a redis-server with the documented quotad user, its
// keys limited to the prefixes of these tests, and the default user
// unchanged for the test's own checks.
func startACLRedis(t *testing.T) *redistest.Server {
	t.Helper()
	r := redistest.Start(t)
	addACLUser(t, r)
	return r
}

// addACLUser adds the documented quotad user to each server (ACLs are per
// server, not replicated) and clears their ACL logs.
func addACLUser(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, r := range servers {
		redisOK(t, r, readmeACL(t, "it:*", aclPassword)...)
		redisOK(t, r, "ACL", "LOG", "RESET")
	}
}

// wantNoACLDenials checks that no server refused a command of the quotad
// user.
func wantNoACLDenials(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, r := range servers {
		if !r.Running() {
			continue
		}
		denied, err := r.Do(t, "ACL", "LOG").ToAny()
		if l, ok := denied.([]any); err != nil || !ok || len(l) != 0 {
			t.Errorf("%s denied commands of the documented ACL user (%v); ACL LOG: %v", r.Addr(), err, denied)
		}
	}
}

// TestACLUserFromDocs runs a sidecar as the minimal ACL user that
// docs/redis.md documents: everything works, Redis denied nothing, and the
// user can do nothing else.
func TestACLUserFromDocs(t *testing.T) {
	r := startACLRedis(t)
	p := launchSidecarEnv(t, socketPath(t), "redis://quotad@"+r.Addr(), []string{"QUOTAD_REDIS_PASSWORD=" + aclPassword})
	p.waitReady(t)
	c := p.dial(t)
	wantTake(t, c.call(takeReq("alice", 1, 60000, "request_id", "a-1")), true, false, 1, 1)
	wantTake(t, c.call(takeReq("alice", 1, 60000, "request_id", "a-1")), true, true, 1, 1)
	wantTake(t, c.call(takeReq("alice", 1, 60000)), false, false, 1, 1)
	wantPeek(t, c.call(peekReq("alice", 1, 60000)), 1, 1)
	// A script run for the first time on this server goes EVALSHA, NOSCRIPT,
	// EVAL: flush the cache so that path runs as this user too.
	redisOK(t, r, "SCRIPT", "FLUSH")
	wantTake(t, c.call(takeReq("bob", 1, 60000)), true, false, 1, 1)
	wantPeek(t, c.call(peekReq("bob", 1, 60000)), 1, 1)
	// Every algorithm's scripts, take, peek and release, as this user.
	for _, line := range []string{
		`{"op":"take","subject":"carol","algorithm":"token_bucket","rate":5,"period_ms":1000,"request_id":"t-1"}`,
		`{"op":"take","subject":"carol","algorithm":"token_bucket","rate":5,"period_ms":1000,"request_id":"t-1"}`,
		`{"op":"peek","subject":"carol","algorithm":"token_bucket","rate":5,"period_ms":1000}`,
		`{"op":"take","subject":"dave","algorithm":"concurrency","limit":2,"lease_ms":30000,"request_id":"l-1"}`,
		`{"op":"peek","subject":"dave","algorithm":"concurrency","limit":2,"lease_ms":30000}`,
		`{"op":"release","subject":"dave","algorithm":"concurrency","limit":2,"lease_ms":30000,"request_id":"l-1"}`,
		`{"op":"settle","subject":"alice","limit":1,"window_ms":60000,"request_id":"a-1","cost":0}`,
		`{"op":"settle","subject":"carol","algorithm":"token_bucket","rate":5,"period_ms":1000,"request_id":"t-1","cost":0}`,
		`{"op":"take","subject":"erin","algorithm":"sliding_window","limit":5,"window_ms":60000,"request_id":"s-1"}`,
		`{"op":"settle","subject":"erin","algorithm":"sliding_window","limit":5,"window_ms":60000,"request_id":"s-1","cost":2}`,
		`{"op":"take","subject":"fay","algorithm":"calendar","limit":5,"period":"day","request_id":"c-1"}`,
		`{"op":"settle","subject":"fay","algorithm":"calendar","limit":5,"period":"day","request_id":"c-1","cost":2}`,
	} {
		if got := c.do(line); !got.ok() {
			t.Errorf("%s as the ACL user: %v", line, got)
		}
	}
	if stdout, _, code := p.cli(t, "ping"); code != 0 || !mustParse(t, stdout).flag(t, "redis_ok") {
		t.Errorf("ping as the ACL user: %s", stdout)
	}
	wantNoACLDenials(t, r)
	if n := quotadConns(t, r); n < 1 || n > 4 {
		t.Errorf("redis has %d quotad connections, want 1 to 4", n)
	}

	as, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{r.Addr()}, Username: "quotad", Password: aclPassword,
		DisableCache: true, ForceSingleClient: true,
	})
	if err != nil {
		t.Fatalf("connect as the ACL user: %v", err)
	}
	defer as.Close()
	for _, cmd := range [][]string{{"SET", "it:x", "v"}, {"HSET", "other:k", "f", "v"}, {"FLUSHALL"}, {"KEYS", "*"}, {"CONFIG", "GET", "*"}} {
		err := as.Do(t.Context(), as.B().Arbitrary(cmd...).Build()).Error()
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%v as the ACL user: %v, want NOPERM", cmd, err)
		}
	}
	assertKeysHaveTTL(t, r, p.prefix)
}

// TestRedisPasswordSources connects with the password from the URL, the
// environment and a file, refuses two sources at once, and never shows a
// password in a log line or an error.
func TestRedisPasswordSources(t *testing.T) {
	r := startACLRedis(t)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(aclPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	user := "redis://quotad@" + r.Addr()
	debug := []string{"--log-level", "debug"}
	good := map[string]*sidecarProc{
		"url":      launchSidecarEnv(t, socketPath(t), "redis://quotad:"+aclPassword+"@"+r.Addr(), nil, debug...),
		"env":      launchSidecarEnv(t, socketPath(t), user, []string{"QUOTAD_REDIS_PASSWORD=" + aclPassword}, debug...),
		"file":     launchSidecarEnv(t, socketPath(t), user, nil, append(debug, "--redis-password-file", pwFile)...),
		"file env": launchSidecarEnv(t, socketPath(t), user, []string{"QUOTAD_REDIS_PASSWORD_FILE=" + pwFile}, debug...),
	}
	for name, p := range good {
		p.waitReady(t)
		wantTake(t, p.dial(t).call(takeReq("alice", 3, 60000)), true, false, 3, 1)
		if p.findLog("info", "quotad started") == nil {
			t.Errorf("%s: no start line in the log", name)
		}
	}

	const wrong = "Wrong-pw-0815"
	bad := launchSidecarEnv(t, socketPath(t), user, []string{"QUOTAD_REDIS_PASSWORD=" + wrong}, debug...)
	eventually(t, "a take to say the password was refused", func() bool {
		stdout, _, _ := bad.cli(t, "take", "--limit", "3", "--window-ms", "60000", "alice")
		return strings.Contains(stdout, "UNAVAILABLE") && strings.Contains(stdout, "WRONGPASS")
	})
	bad.waitLog(t, "warn", "cannot connect to redis, retrying")

	_, stderr, code := cliEnv(t, []string{"QUOTAD_REDIS_PASSWORD=" + aclPassword},
		"serve", "--socket", socketPath(t), "--redis-url", "redis://quotad:"+aclPassword+"@"+r.Addr())
	if code != 1 || !strings.Contains(stderr, "redis password given by the URL and QUOTAD_REDIS_PASSWORD: give it once") {
		t.Errorf("two password sources: exit %d, stderr %q; want exit 1 saying to give it once", code, stderr)
	}
	if strings.Contains(stderr, aclPassword) {
		t.Errorf("the error shows the password: %q", stderr)
	}

	for _, p := range append([]*sidecarProc{bad}, good["url"], good["env"], good["file"], good["file env"]) {
		p.signal(t, os.Interrupt)
		p.wait(t)
		for _, pw := range []string{aclPassword, wrong} {
			if strings.Contains(p.out.String(), pw) {
				t.Errorf("the log of the sidecar on %s shows a password:\n%s", p.socket, p.out.String())
			}
		}
	}
}

func TestServeHelpSaysHowTheURLSelectsTheTopology(t *testing.T) {
	stdout, _, code := cli(t, "serve", "--help")
	for _, want := range []string{"rediss://", "addr=", "master_set=", "sentinel_password=", "--redis-ca-file", "QUOTAD_REDIS_PASSWORD", "--redis-password-file"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("serve --help (exit %d) does not mention %s:\n%s", code, want, stdout)
		}
	}
}

// TestDoctorAsTheDocsDoctorUser runs quotad doctor --fix as the doctor
// user docs/operations.md documents: it finds and repairs a key without a
// TTL, and Redis denied it nothing.
func TestDoctorAsTheDocsDoctorUser(t *testing.T) {
	r := redistest.Start(t)
	redisOK(t, r, readmeACLFor(t, "quotad-doctor", "it:*", aclPassword)...)
	redisOK(t, r, "ACL", "LOG", "RESET")
	prefix := keyPrefix(t)
	redisOK(t, r, "HSET", prefix+"fw:{p:api:locked}", "used", "5", "policy", "5:60000")
	cmd := exec.Command(quotadBin, "doctor", "--redis-url", "redis://quotad-doctor@"+r.Addr(), "--key-prefix", prefix, "--fix")
	cmd.Env = cleanEnv("QUOTAD_REDIS_PASSWORD=" + aclPassword)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("quotad doctor --fix: %v, want exit 3 (a problem found and repaired)\n%s", err, out)
	}
	if ttl, err := r.Do(t, "PTTL", prefix+"fw:{p:api:locked}").AsInt64(); err != nil || ttl <= 0 || ttl > 60000 {
		t.Fatalf("PTTL after doctor --fix = %d, %v: want the window's own 60000 ms at most\n%s", ttl, err, out)
	}
	wantNoACLDenials(t, r)
}
