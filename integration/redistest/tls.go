package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Certs are PEM files for a TLS redis-server: a CA, and a certificate for
// 127.0.0.1 and localhost signed by it.
type Certs struct {
	CAFile   string // the CA certificate: what a client trusts
	CertFile string // the server's certificate
	KeyFile  string // the server's private key
}

// NewCerts generates a fresh CA and server certificate in a temporary
// directory of the test. Two calls give two unrelated CAs, so one's CA file
// does not trust the other's server: that is how a test gets a bad
// certificate.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "quotad test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("create CA certificate: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatalf("parse CA certificate: %v", err)
	}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "redis-server"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatalf("create server certificate: %v", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("marshal server key: %v", err)
	}
	c := &Certs{
		CAFile:   filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "server.pem"),
		KeyFile:  filepath.Join(dir, "server.key"),
	}
	writePEM(t, c.CAFile, "CERTIFICATE", caDER)
	writePEM(t, c.CertFile, "CERTIFICATE", der)
	writePEM(t, c.KeyFile, "EC PRIVATE KEY", keyDER)
	return c
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

// WithTLS makes the server also accept TLS, with certs, on a second free
// port (TLSAddr). Clients are not asked for certificates. The plain port
// stays open for the harness's own checks and Do.
func WithTLS(certs *Certs) Option {
	return func(c *config) { c.tls = certs }
}

// TLSAddr is "127.0.0.1:port" of the TLS port; empty without WithTLS.
func (s *Server) TLSAddr() string {
	if s.tls == nil {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tlsPort))
}

// TLSURL is "rediss://127.0.0.1:port"; empty without WithTLS.
func (s *Server) TLSURL() string {
	if s.tls == nil {
		return ""
	}
	return "rediss://" + s.TLSAddr()
}

func (s *Server) tlsArgs() []string {
	if s.tls == nil {
		return nil
	}
	return []string{
		"--tls-port", strconv.Itoa(s.tlsPort),
		"--tls-cert-file", s.tls.CertFile,
		"--tls-key-file", s.tls.KeyFile,
		"--tls-ca-cert-file", s.tls.CAFile,
		"--tls-auth-clients", "no",
	}
}
