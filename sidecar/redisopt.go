package sidecar

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
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
	copt, err := rueidis.ParseURL(opts.RedisURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			// A *url.Error quotes the whole URL, password included.
			return copt, fmt.Errorf("parse --redis-url %s: not a valid URL (percent-encode special characters in the password)", RedactURL(opts.RedisURL))
		}
		return copt, fmt.Errorf("parse --redis-url %s: %w", RedactURL(opts.RedisURL), err)
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

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
