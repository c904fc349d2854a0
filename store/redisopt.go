package store

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// clientName is how quotad's connections show in CLIENT LIST, unless the
// URL's client_name says otherwise.
const clientName = "quotad"

// sentinelRefresh is how often a Sentinel client re-reads the master's
// address from the sentinels, in addition to following +switch-master
// events: a missed event would otherwise bind it to a demoted master.
const sentinelRefresh = 5 * time.Second

// redisClientOption builds the rueidis options for opts.RedisURL: the
// topology (one address, several addr= for a Cluster, master_set= for
// Sentinel), TLS with an optional CA file, and the password from the URL,
// opts.Password or opts.PasswordFile. No error it returns holds the
// password.
func redisClientOption(opts StoreOptions) (rueidis.ClientOption, error) {
	if err := checkRedisURL(opts.RedisURL); err != nil {
		return rueidis.ClientOption{}, err
	}
	copt, err := rueidis.ParseURL(opts.RedisURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			// A *url.Error quotes the whole URL, password included.
			return copt, fmt.Errorf("--redis-url %s: not a valid URL", RedactURL(opts.RedisURL))
		}
		return copt, fmt.Errorf("--redis-url %s: %s", RedactURL(opts.RedisURL), strings.TrimPrefix(err.Error(), "redis: "))
	}
	if err := applyPassword(&copt, opts); err != nil {
		return copt, err
	}
	if opts.CAFile != "" {
		if copt.TLSConfig == nil {
			return copt, fmt.Errorf("--redis-ca-file %s: needs a rediss:// URL (TLS)", opts.CAFile)
		}
		pool, err := loadCAFile(opts.CAFile)
		if err != nil {
			return copt, err
		}
		copt.TLSConfig.RootCAs = pool
	}
	if copt.ClientName == "" {
		copt.ClientName = clientName
	}
	// The name set by HELLO identifies quotad's connections; CLIENT SETINFO
	// would only cost a round trip and a command in the ACL.
	copt.ClientSetInfo = rueidis.DisableClientSetInfo
	if copt.Sentinel.MasterSet != "" {
		// The addresses are the sentinels'. They are reached like the
		// master (TLS or not, same CA), with their own credentials from
		// sentinel_username= and sentinel_password= if they need any.
		q, _ := url.ParseQuery(rawQuery(opts.RedisURL))
		copt.Sentinel.Username = q.Get("sentinel_username")
		copt.Sentinel.Password = q.Get("sentinel_password")
		copt.Sentinel.ClientName = copt.ClientName
		if copt.TLSConfig != nil {
			copt.Sentinel.TLSConfig = copt.TLSConfig.Clone()
		}
		copt.Sentinel.TopologyRefreshInterval = sentinelRefresh
	}
	return copt, nil
}

// applyPassword takes the password from exactly one of the URL,
// opts.Password and opts.PasswordFile; two sources are an error rather than
// a silent choice.
func applyPassword(copt *rueidis.ClientOption, opts StoreOptions) error {
	var sources []string
	if copt.Password != "" {
		sources = append(sources, "the URL")
	}
	if opts.Password != "" {
		sources = append(sources, "QUOTAD_REDIS_PASSWORD")
	}
	if opts.PasswordFile != "" {
		sources = append(sources, "--redis-password-file")
	}
	if len(sources) > 1 {
		return fmt.Errorf("redis password given by %s: give it once", strings.Join(sources, " and "))
	}
	switch {
	case opts.Password != "":
		copt.Password = opts.Password
	case opts.PasswordFile != "":
		b, err := os.ReadFile(opts.PasswordFile)
		if err != nil {
			return fmt.Errorf("--redis-password-file: %w", err)
		}
		// Editors and `echo` end the file with a newline; Redis passwords
		// never do.
		pw := strings.TrimRight(string(b), "\r\n")
		if pw == "" {
			return fmt.Errorf("--redis-password-file %s: the file is empty", opts.PasswordFile)
		}
		copt.Password = pw
	}
	return nil
}

func loadCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--redis-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--redis-ca-file %s: no PEM certificate in the file", path)
	}
	return pool, nil
}

func rawQuery(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.RawQuery
	}
	return ""
}

// describeRedisErr says what an operator should check when the cause of an
// error is the TLS setup rather than Redis being down.
// It describes an error once, however often it is passed.
func describeRedisErr(err error) error {
	var (
		described *untrustedCertError
		unknownCA *x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
	)
	if errors.As(err, &described) {
		return err
	}
	if errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) || errors.As(err, &verify) {
		return &untrustedCertError{err: err}
	}
	return err
}

// untrustedCertError is a connection error caused by Redis's certificate.
type untrustedCertError struct{ err error }

func (e *untrustedCertError) Error() string {
	return "redis's TLS certificate is not trusted (check --redis-ca-file and the host name in --redis-url): " + e.err.Error()
}

func (e *untrustedCertError) Unwrap() error { return e.err }

// LastError is why Redis was last found down, or nil while it is up. On a
// Cluster it is the error of a slot owner that is down, naming the node.
func (s *Store) LastError() error {
	if ch := s.cluster.Load(); ch != nil {
		return ch.lastError()
	}
	return s.lastError()
}

// OpenClient connects to the Redis that opts.RedisURL names, with the same
// URL syntax, TLS CA file and password sources as a Store, for tools such
// as the doctor that read and repair keys rather than decide.
func OpenClient(opts StoreOptions) (rueidis.Client, error) {
	if opts.RedisURL == "" {
		return nil, fmt.Errorf("--redis-url is required: this command inspects a real Redis")
	}
	copt, err := redisClientOption(opts)
	if err != nil {
		return nil, err
	}
	copt.DisableCache = true
	c, err := rueidis.NewClient(copt)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", RedactURL(opts.RedisURL), describeRedisErr(err))
	}
	return c, nil
}

// redisSchemes are the URL schemes rueidis dials.
var redisSchemes = []string{"redis", "rediss", "unix", "valkey", "valkeys"}

// checkRedisURL says what is wrong with a --redis-url that rueidis would
// refuse or misread, in terms of the URL given: a missing scheme, a port
// that is not a number, no host, a password that needs percent-encoding.
// Its messages never hold the password: the URL is shown through
// RedactURL, or with everything before the @ hidden when it does not parse.
func checkRedisURL(raw string) error {
	fail := func(shown, format string, args ...any) error {
		return fmt.Errorf("--redis-url %s: %s", shown, fmt.Sprintf(format, args...))
	}
	shown := redactUnparsed(raw)
	scheme, rest, hasScheme := strings.Cut(raw, "://")
	if !hasScheme {
		switch {
		case strings.HasPrefix(raw, "/"):
			return fail(shown, "no scheme: write unix://%s for a Unix socket", shown)
		case knownScheme(strings.SplitN(raw, ":", 2)[0]):
			s, after, _ := strings.Cut(raw, ":")
			return fail(shown, "%s: must be followed by //, as in %s://%s", s, s, redactUnparsed(after))
		}
		return fail(shown, "no scheme: did you mean redis://%s?", shown)
	}
	if !knownScheme(scheme) {
		return fail(shown, "unknown scheme %q: want redis://, rediss:// (TLS) or unix:// (a socket); Cluster and Sentinel use redis:// or rediss:// too", scheme)
	}
	// The authority ends at the first / ? or #, unless the password holds
	// one: then an @ comes after it, and not inside a query's key=value
	// (?sentinel_password=p@ss).
	end := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	if at := strings.LastIndex(rest, "@"); at >= end {
		q := strings.IndexByte(rest, '?')
		if q < 0 || q > at || !strings.Contains(rest[q:at], "=") {
			return fail(shown, "the user name or password holds / ? or #: percent-encode them (%%2F, %%3F, %%23)")
		}
	}
	authority := rest[:end]
	host := authority
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		if err := checkUserinfo(authority[:at]); err != "" {
			return fail(shown, "%s", err)
		}
		host = authority[at+1:]
	}
	if strings.EqualFold(scheme, "unix") {
		u, err := url.Parse(raw)
		switch {
		case err != nil:
			return fail(shown, "not a valid URL")
		case host != "":
			return fail(shown, "the socket path must be absolute, after three slashes: unix:///%s%s", host, u.Path)
		case u.Path == "" || u.Path == "/":
			return fail(shown, "no socket path: write unix:///path/to/redis.sock")
		}
		return nil
	}
	if host == "" {
		return fail(shown, "no host: write redis://host:6379 (redis://localhost:6379 for this machine)")
	}
	if err := checkHostPort(host); err != "" {
		return fail(shown, "%s", err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fail(shown, "not a valid URL")
	}
	shown = RedactURL(raw)
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		if strings.Contains(p, "/") {
			return fail(shown, "path %q: only a database number may follow the host, as in redis://host:6379/2", u.Path)
		}
		if _, err := strconv.Atoi(p); err != nil {
			return fail(shown, "database %q is not a number: redis://host:6379/2 selects database 2", p)
		}
	}
	for _, addr := range u.Query()["addr"] {
		if err := checkHostPort(addr); err != "" {
			return fail(shown, "addr=%s: %s", addr, err)
		}
	}
	return nil
}

func knownScheme(s string) bool {
	for _, k := range redisSchemes {
		if strings.EqualFold(s, k) {
			return true
		}
	}
	return false
}

// checkUserinfo finds what url.Parse would refuse in the part before the
// @, without quoting it: it holds the password.
func checkUserinfo(ui string) string {
	for i := 0; i < len(ui); i++ {
		c := ui[i]
		switch {
		case c == '%':
			if i+2 >= len(ui) || !isHex(ui[i+1]) || !isHex(ui[i+2]) {
				return "the user name or password holds a % that starts no percent-escape: write % as %25"
			}
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("-._:~!$&'()*+,;=@", c) >= 0:
		default:
			return "the user name or password holds a character that must be percent-encoded (a space, \" < > [ ] ^ ` { | } or a control character)"
		}
	}
	return ""
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// checkHostPort checks a host[:port] with no user information in it.
func checkHostPort(hp string) string {
	host, port := hp, ""
	if strings.HasPrefix(hp, "[") {
		i := strings.Index(hp, "]")
		if i < 0 {
			return "host " + strconv.Quote(hp) + ": an IPv6 address needs its closing ]"
		}
		host, port = hp[:i+1], strings.TrimPrefix(hp[i+1:], ":")
		if rest := hp[i+1:]; rest != "" && !strings.HasPrefix(rest, ":") {
			return "host " + strconv.Quote(hp) + ": only :port may follow the ]"
		}
	} else if i := strings.LastIndex(hp, ":"); i >= 0 {
		host, port = hp[:i], hp[i+1:]
		if strings.Contains(host, ":") {
			return "host " + strconv.Quote(host) + ": write an IPv6 address in brackets, as in redis://[::1]:6379"
		}
	}
	if host == "" {
		return "no host before :" + port
	}
	if strings.ContainsAny(host, "% ") {
		return "host " + strconv.Quote(host) + " is not a host name or address"
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		switch {
		case err != nil:
			return "port " + strconv.Quote(port) + " is not a number"
		case n < 1 || n > 65535:
			return "port " + port + " is out of range (1 to 65535)"
		}
	}
	return ""
}

// redactUnparsed shows a URL that may not parse: everything before its
// last @ (the user name and password) becomes xxxxx, and the query, which
// may hold sentinel_password=, is left out.
func redactUnparsed(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		scheme, rest = "", raw
	} else {
		scheme += "://"
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = "xxxxx@" + rest[at+1:]
	}
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		rest = rest[:q] + "?..."
	}
	return scheme + rest
}

// MaxFlushDelay bounds StoreOptions.FlushDelay: a longer wait would add more
// latency to every decision than any batching it buys back.
const MaxFlushDelay = time.Millisecond

// Validate refuses store options that cannot work, naming the flag that
// sets each. The URL itself is checked by OpenStore, which parses it.
func (o StoreOptions) Validate() error {
	if o.Timeout < 0 {
		return errors.New("--redis-timeout must be positive")
	}
	if o.FlushDelay < 0 || o.FlushDelay > MaxFlushDelay {
		return fmt.Errorf("--redis-flush-delay must be between 0 and %v", MaxFlushDelay)
	}
	return nil
}
