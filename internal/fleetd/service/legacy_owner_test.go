package service

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// A PKI directory made before the admin CA existed keeps working: its
// owner credential, a client certificate of the serving CA, has role owner;
// fleetd admin create says how to add the admin CA.
func TestTheOwnerCredentialOfAnOlderPKIKeepsWorking(t *testing.T) {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	b, err := pki.Init(pkiDir, pki.InitOptions{TrustDomain: "old.nodetrust.test", ServerName: "fleetd.test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{pki.AdminCACertFile, pki.AdminCAKeyFile} {
		if err := os.Remove(pki.Path(pkiDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	auth, err := pki.LoadAuthority(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	// The owner credential as fleetd init made it then: the serving CA's.
	caKey, err := pki.ReadPrivateKey(pki.Path(pkiDir, pki.ServingCAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("spiffe://old.nodetrust.test/admin/owner")
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(4242), Subject: pkix.Name{CommonName: "owner"}, URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, auth.ServingCA, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := New(Config{Authority: auth, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()

	cert := tls.Certificate{Certificate: [][]byte{der, auth.ServingCA.Raw}, PrivateKey: key}
	tc := tlspin.Client(b.ServingCASPKIPin, "fleetd.test", func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil })
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := adminv1.NewAdminClient(conn)
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	if _, err := admin.CreateToken(cctx, &adminv1.CreateTokenRequest{Role: "worker"}); err != nil {
		t.Fatalf("the older owner credential may not create a token: %v", err)
	}
	list, err := admin.ListAdmins(cctx, &adminv1.ListAdminsRequest{})
	if err != nil || len(list.Admins) != 1 || list.Admins[0].Name != "owner" || list.Admins[0].Role != "owner" {
		t.Errorf("ListAdmins = %v, %v; want the owner, recorded", list, err)
	}
	key2, _ := pki.GenerateKey()
	csr, _ := pki.CreateCSR(key2)
	_, err = admin.CreateAdmin(cctx, &adminv1.CreateAdminRequest{Name: "alice", Role: "declarer", Csr: csr})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "fleetd init --dir PKI_DIR --add-admin-ca") {
		t.Errorf("CreateAdmin without an admin CA: %v", err)
	}
}
