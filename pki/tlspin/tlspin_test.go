package tlspin

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T, name string) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return testCA{c, key}
}

func (ca testCA) leaf(t *testing.T, dns string) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), DNSNames: []string{dns},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

func TestVerify(t *testing.T) {
	ca := newCA(t, "serving")
	other := newCA(t, "other")
	leaf := ca.leaf(t, "fleetd.test")
	pin := pki.PinOfCert(ca.cert)

	if err := Verify([]*x509.Certificate{leaf, ca.cert}, pin, "fleetd.test"); err != nil {
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
		{"another CA's pin", []*x509.Certificate{leaf, ca.cert}, pki.PinOfCert(other.cert), "fleetd.test", "", ErrPinMismatch},
		{"the pinned CA missing from the chain", []*x509.Certificate{leaf}, pin, "fleetd.test", "", ErrPinMismatch},
		{"a leaf not issued by the pinned CA", []*x509.Certificate{other.leaf(t, "fleetd.test"), ca.cert}, pin, "fleetd.test", "verify the server's certificate", ErrUntrusted},
		{"another server name", []*x509.Certificate{leaf, ca.cert}, pin, "evil.test", "evil.test", ErrUntrusted},
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
