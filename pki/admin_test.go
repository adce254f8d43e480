package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestIssueAndParseAdminCert(t *testing.T) {
	a, _ := newAuthority(t, "")
	key := mustKey(t)
	c, err := IssueAdminCert(a.AdminCA, a.AdminSigner, AdminCertRequest{PublicKey: key.Public(), TrustDomain: testTD, Name: "alice", Role: "declarer",
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(a.AdminCA)
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("an admin certificate does not verify against the admin CA: %v", err)
	}
	info, err := ParseAdminCert(c, testTD)
	if err != nil || info != (AdminCertInfo{Name: "alice", Role: "declarer"}) {
		t.Fatalf("ParseAdminCert = %+v, %v", info, err)
	}

	refused := []struct {
		name string
		cert *x509.Certificate
		td   string
		want string
	}{
		{"another trust domain", c, "other.test", "no single spiffe"},
		{"no role", signWithNodeCA(t, a, &x509.Certificate{Subject: pkix.Name{CommonName: "bob"}, URIs: mustURIs(t, "spiffe://"+testTD+"/admin/bob")}), testTD, "0 roles"},
		{"two roles", signWithNodeCA(t, a, &x509.Certificate{Subject: pkix.Name{CommonName: "bob", OrganizationalUnit: []string{"owner", "auditor"}}, URIs: mustURIs(t, "spiffe://"+testTD+"/admin/bob")}), testTD, "2 roles"},
		{"a common name that is not the name", signWithNodeCA(t, a, &x509.Certificate{Subject: pkix.Name{CommonName: "eve", OrganizationalUnit: []string{"owner"}}, URIs: mustURIs(t, "spiffe://"+testTD+"/admin/bob")}), testTD, "common name"},
		{"a node certificate", signWithNodeCA(t, a, &x509.Certificate{Subject: pkix.Name{CommonName: "n1"}, URIs: mustURIs(t, "spiffe://"+testTD+"/node/n1")}), testTD, "no single spiffe"},
		{"no certificate", nil, testTD, "no certificate"},
	}
	for _, tt := range refused {
		t.Run("refuses "+tt.name, func(t *testing.T) {
			if _, err := ParseAdminCert(tt.cert, tt.td); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseAdminCert: %v, want %q", err, tt.want)
			}
		})
	}
	for _, bad := range []AdminCertRequest{
		{PublicKey: key.Public(), TrustDomain: testTD, Name: "Alice", Role: "owner", NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)},
		{PublicKey: key.Public(), TrustDomain: testTD, Name: "alice", Role: "", NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)},
		{PublicKey: key.Public(), TrustDomain: testTD, Name: "alice", Role: "owner", NotBefore: time.Now(), NotAfter: time.Now().Add(-time.Hour)},
	} {
		if _, err := IssueAdminCert(a.AdminCA, a.AdminSigner, bad); err == nil {
			t.Errorf("IssueAdminCert(%+v) succeeded", bad)
		}
	}
}

func TestAddAdminCAToAnOlderDirectory(t *testing.T) {
	a, dir := newAuthority(t, "")
	if err := AddAdminCA(dir, time.Now()); !errors.Is(err, ErrExists) {
		t.Fatalf("AddAdminCA on a directory with an admin CA: %v, want ErrExists", err)
	}
	for _, f := range []string{AdminCACertFile, AdminCAKeyFile} {
		if err := os.Remove(Path(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	old, err := LoadAuthority(dir)
	if err != nil || old.AdminCA != nil || old.AdminSigner != nil {
		t.Fatalf("a directory without an admin CA: %v, CA %v", err, old.AdminCA != nil)
	}
	if err := AddAdminCA(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	b, err := LoadAuthority(dir)
	if err != nil || b.AdminCA == nil || b.AdminCA.Equal(a.AdminCA) {
		t.Fatalf("after AddAdminCA: %v", err)
	}
	if err := b.AdminCA.CheckSignatureFrom(b.Root); err != nil {
		t.Errorf("the added admin CA is not signed by the root: %v", err)
	}
	if st, err := os.Stat(Path(dir, AdminCAKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("admin-ca.key: %v %v", st.Mode(), err)
	}
}
