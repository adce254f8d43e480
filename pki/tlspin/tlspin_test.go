package tlspin

import (
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/pkitest"
)

type testCA struct{ *pkitest.CA }

func newCA(t *testing.T, name string) testCA { return testCA{pkitest.NewCA(t, name)} }

func (ca testCA) leaf(t *testing.T, dns string) *x509.Certificate {
	t.Helper()
	return ca.Issue(t, &x509.Certificate{
		DNSNames:  []string{dns},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}, pkitest.NewKey(t).Public())
}

func TestVerify(t *testing.T) {
	ca := newCA(t, "serving")
	other := newCA(t, "other")
	leaf := ca.leaf(t, "fleetd.test")
	pin := pki.PinOfCert(ca.Cert)

	if err := Verify([]*x509.Certificate{leaf, ca.Cert}, pin, "fleetd.test"); err != nil {
		t.Fatalf("a good chain: %v", err)
	}
	cases := []struct {
		name    string
		chain   []*x509.Certificate
		pin     pki.Pin
		host    string
		want    string
		wantErr error
	}{
		{"another CA's pin", []*x509.Certificate{leaf, ca.Cert}, pki.PinOfCert(other.Cert), "fleetd.test", "", ErrPinMismatch},
		{"the pinned CA missing from the chain", []*x509.Certificate{leaf}, pin, "fleetd.test", "", ErrPinMismatch},
		{"a leaf not issued by the pinned CA", []*x509.Certificate{other.leaf(t, "fleetd.test"), ca.Cert}, pin, "fleetd.test", "verify the server's certificate", ErrUntrusted},
		{"another server name", []*x509.Certificate{leaf, ca.Cert}, pin, "evil.test", "evil.test", ErrUntrusted},
		{"no certificate", nil, pin, "fleetd.test", "no certificate", ErrUntrusted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify(tc.chain, tc.pin, tc.host)
			if err == nil {
				t.Fatal("accepted")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
