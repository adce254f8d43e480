package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// templateOf rebuilds the template Issue gave for c.
func templateOf(c *x509.Certificate) *x509.Certificate {
	t := &x509.Certificate{
		SerialNumber:          c.SerialNumber,
		Subject:               c.Subject,
		NotBefore:             c.NotBefore,
		NotAfter:              c.NotAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		URIs:                  c.URIs,
	}
	t.Subject.Names = nil
	for _, e := range c.Extensions {
		if e.Id.Equal(OIDTPMAKName) {
			t.ExtraExtensions = append(t.ExtraExtensions, e)
		}
	}
	return t
}

// TestSignLeafMatchesCreateCertificate: the certificate Issue encodes
// itself is, to the byte, the one x509.CreateCertificate makes of the same
// template (signatures apart: ECDSA's are randomised), its signature
// verifies under the node CA, it parses with crypto/x509 and is a valid
// node certificate, and it verifies with openssl up to the root.
func TestSignLeafMatchesCreateCertificate(t *testing.T) {
	a, _ := newAuthority(t, "")
	cases := []struct {
		name, role, site string
		ak               []byte
	}{
		{"plain", "", "", nil},
		{"role and site", "worker", "lab-2 / rack 7", nil},
		{"AK name", "gpu", "", append([]byte{0x00, 0x0b}, bytes.Repeat([]byte{0xab}, 32)...)},
		{"long utf-8 role", strings.Repeat("é", 32), "", nil},
	}
	var pems []byte
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := issueLeaf(t, a.Issuer, mustKey(t), "node-"+strings.ReplaceAll(strings.ToLower(tc.name), " ", "-")[:4], tc.role, tc.site, tc.ak)
			ref, err := x509.CreateCertificate(rand.Reader, templateOf(got), a.NodeCA, got.PublicKey, a.Issuer.key)
			if err != nil {
				t.Fatal(err)
			}
			want, err := x509.ParseCertificate(ref)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.RawTBSCertificate, want.RawTBSCertificate) {
				t.Fatalf("the signed part differs from CreateCertificate's:\n got %x\nwant %x", got.RawTBSCertificate, want.RawTBSCertificate)
			}
			if got.SignatureAlgorithm != want.SignatureAlgorithm {
				t.Errorf("signature algorithm %v, want %v", got.SignatureAlgorithm, want.SignatureAlgorithm)
			}
			if err := got.CheckSignatureFrom(a.NodeCA); err != nil {
				t.Fatalf("signature: %v", err)
			}
			if _, err := ParseNodeCert(got); err != nil {
				t.Fatalf("ParseNodeCert: %v", err)
			}
			pems = append(pems, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: got.Raw})...)
		})
	}
	opensslVerify(t, a, pems)
}

// opensslVerify runs openssl verify on each certificate of pems against
// the root, with the node CA as intermediate.
func opensslVerify(t *testing.T, a *Authority, pems []byte) {
	t.Helper()
	bin, err := exec.LookPath("openssl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("openssl is not installed: install it (apt-get install openssl) to check issued certificates")
		}
		t.Skip("openssl is not installed")
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	root := write("root.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Root.Raw}))
	inter := write("inter.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.NodeCA.Raw}))
	n := 0
	for rest := pems; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		leaf := write("leaf.pem", pem.EncodeToMemory(b))
		// -attime: the test PKI is made at testNow.
		out, err := exec.Command(bin, "verify", "-attime", strconv.FormatInt(testNow.Add(time.Hour).Unix(), 10), "-purpose", "sslclient",
			"-CAfile", root, "-untrusted", inter, leaf).CombinedOutput()
		if err != nil || !strings.Contains(string(out), ": OK") {
			t.Fatalf("openssl verify: %v\n%s", err, out)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no certificate to verify")
	}
}

// badSigner is a CA key in a token that signs wrongly.
type badSigner struct{ crypto.Signer }

func (s badSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	other, _ := ecdsa.GenerateKey(s.Public().(*ecdsa.PublicKey).Curve, rand.Reader)
	return other.Sign(r, d, o)
}

// goodSigner is a CA key in a token (not an *ecdsa.PrivateKey).
type goodSigner struct{ crypto.Signer }

func TestSignLeafChecksASignerNotInMemory(t *testing.T) {
	a, _ := newAuthority(t, "")
	good, err := NewIssuer(a.NodeCA, goodSigner{a.Issuer.key}, a.Issuer.Chain(), a.Issuer.TrustDomain())
	if err != nil {
		t.Fatal(err)
	}
	c := issueLeaf(t, good, mustKey(t), "n1", "worker", "", nil)
	if err := c.CheckSignatureFrom(a.NodeCA); err != nil {
		t.Fatal(err)
	}
	bad, err := NewIssuer(a.NodeCA, badSigner{a.Issuer.key}, a.Issuer.Chain(), a.Issuer.TrustDomain())
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.Issue(LeafRequest{PublicKey: mustKey(t).Public(), NodeID: "n1", NotBefore: testNow, NotAfter: testNow.Add(time.Hour)})
	if err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("a signer that signs wrongly: err = %v, want a refusal", err)
	}
}

// TestLeafTimesMatchEncodingASN1 checks the hand-written validity times
// against encoding/asn1's at the edges of UTCTime's range and off UTC.
func TestLeafTimesMatchEncodingASN1(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(1949, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Date(1950, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2049, 12, 31, 23, 59, 59, 999, time.UTC),
		time.Date(2050, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 2, 7, 5, 9, 123456789, time.FixedZone("x", 5*3600+1800)),
	} {
		want, err := asn1.Marshal(tm.UTC().Truncate(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if got := appendDERTime(nil, tm); !bytes.Equal(got, want) {
			t.Errorf("%s: %x, want encoding/asn1's %x", tm, got, want)
		}
	}
}

func TestMarshalSPKIMatchesX509(t *testing.T) {
	var keys []crypto.PublicKey
	for range 8 {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.Public())
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys = append(keys, p384.Public(), edPub)
	for _, pub := range keys {
		want, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		got, err := marshalSPKI(pub)
		if err != nil {
			t.Fatalf("marshalSPKI(%T): %v", pub, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("marshalSPKI(%T) = %x, want x509's %x", pub, got, want)
		}
	}
}

func TestMarshalSubjectMatchesEncodingASN1(t *testing.T) {
	var values []string
	for b := range 128 {
		values = append(values, "a"+string(rune(b))+"z")
	}
	values = append(values, "", "node-1", "ams1", "example.test", "Zürich", "東京", "a*b", "a&b", "x\x00y",
		strings.Repeat("r", 127), strings.Repeat("é", 100), strings.Repeat("s", 300))
	names := []pkix.Name{
		{CommonName: "n1", Organization: []string{"example.test"}},
		{CommonName: "n1", Organization: []string{"example.test"}, OrganizationalUnit: []string{"worker"}, Locality: []string{"ams1"}},
		{Organization: []string{""}},
		{},
		// Not a subject Issue makes: encoding/asn1 writes them.
		{CommonName: "n1", Organization: []string{"a", "b"}},
		{CommonName: "n1", Country: []string{"NL"}},
		{CommonName: "n1", SerialNumber: "42"},
		{CommonName: "n1", ExtraNames: []pkix.AttributeTypeAndValue{{Type: asn1.ObjectIdentifier{2, 5, 4, 5}, Value: "7"}}},
	}
	for i, v := range values {
		w := values[(i*7+3)%len(values)]
		names = append(names,
			pkix.Name{CommonName: v, Organization: []string{w}, OrganizationalUnit: []string{v}, Locality: []string{w}},
			pkix.Name{CommonName: w, Organization: []string{v}, Locality: []string{v}})
	}
	for _, n := range names {
		want, err := asn1.Marshal(n.ToRDNSequence())
		if err != nil {
			t.Fatal(err)
		}
		got, err := marshalSubject(n)
		if err != nil {
			t.Fatalf("marshalSubject(%+v): %v", n, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("marshalSubject(%+v) = %x, want encoding/asn1's %x", n, got, want)
		}
	}
	// Invalid UTF-8 is refused, as encoding/asn1 refuses it.
	if _, err := marshalSubject(pkix.Name{CommonName: "n1", OrganizationalUnit: []string{"\xff"}}); err == nil {
		t.Error("marshalSubject accepted invalid UTF-8")
	}
}
