package redistest_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"testing"

	"github.com/redis/rueidis"

	"quotad/integration/redistest"
)

func tlsClient(t *testing.T, s *redistest.Server, caFile string) (rueidis.Client, error) {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the CA file")
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{s.TLSAddr()},
		TLSConfig:         &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"},
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err == nil {
		t.Cleanup(c.Close)
	}
	return c, err
}

func TestTLSServerTrustsOnlyItsOwnCA(t *testing.T) {
	certs := redistest.NewCerts(t)
	s := redistest.Start(t, redistest.WithTLS(certs))
	if s.TLSAddr() == "" || s.TLSAddr() == s.Addr() || s.TLSURL() != "rediss://"+s.TLSAddr() {
		t.Fatalf("TLSAddr %q, Addr %q, TLSURL %q", s.TLSAddr(), s.Addr(), s.TLSURL())
	}
	c, err := tlsClient(t, s, certs.CAFile)
	if err != nil {
		t.Fatalf("connect with the server's CA: %v", err)
	}
	if got, err := c.Do(t.Context(), c.B().Ping().Build()).ToString(); err != nil || got != "PONG" {
		t.Fatalf("PING over TLS = %q, %v", got, err)
	}
	_, err = tlsClient(t, s, redistest.NewCerts(t).CAFile)
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("connect with another CA: %v, want x509.UnknownAuthorityError", err)
	}
}

func TestClusterFormsAndServesEverySlot(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	if len(c.Masters) != 3 || len(c.Replicas) != 3 {
		t.Fatalf("%d masters, %d replicas", len(c.Masters), len(c.Replicas))
	}
	for _, slot := range []int{0, 5461, 16383} {
		if o := c.Owner(t, slot); o == nil || o.InfoField(t, "replication", "role") != "master" {
			t.Fatalf("slot %d has no master", slot)
		}
	}
	for i, r := range c.Replicas {
		if got := r.InfoField(t, "replication", "master_port"); got == "" || c.Masters[i].Addr() != "127.0.0.1:"+got {
			t.Fatalf("replica %d replicates port %q, want master %s", i, got, c.Masters[i].Addr())
		}
	}
}

func TestSentinelFailsOver(t *testing.T) {
	s := redistest.StartSentinel(t)
	if got := s.MasterAddr(t); got != s.Master.Addr() {
		t.Fatalf("sentinels name %s as master, want %s", got, s.Master.Addr())
	}
	s.Failover(t)
	if got := s.MasterAddr(t); got != s.Replica.Addr() {
		t.Fatalf("after failover the sentinels name %s as master, want %s", got, s.Replica.Addr())
	}
}

func TestClusterKillMasterPromotesItsReplica(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	c.KillMaster(t, 1)
	if c.Masters[1].Running() {
		t.Fatal("killed master still running")
	}
	c.WaitPromoted(t, 1)
	if o := c.Owner(t, 8000); o != c.Replicas[1] {
		t.Fatalf("slot 8000 on %s, want the promoted replica %s", o.Addr(), c.Replicas[1].Addr())
	}
}

func TestInitialMasterMatchesTheSlotRanges(t *testing.T) {
	c := &redistest.Cluster{Masters: make([]*redistest.Server, 3)}
	for i, r := range [][2]int{{0, 5460}, {5461, 10921}, {10922, 16383}} {
		for _, s := range r {
			if got := c.InitialMaster(s); got != i {
				t.Errorf("InitialMaster(%d) = %d, want %d", s, got, i)
			}
		}
	}
}
