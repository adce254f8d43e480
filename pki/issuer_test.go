package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

func TestIssueAndParseNodeCert(t *testing.T) {
	a, _ := newAuthority(t, "")
	ak := []byte{0x00, 0x0b, 0xde, 0xad, 0xbe, 0xef}
	tests := []struct {
		name             string
		role, site       string
		ak               []byte
		wantURIs         []string
		wantOU, wantSite []string
	}{
		{
			name: "a plain node certificate carries its SPIFFE ID, role and site",
			role: "worker", site: "ams1",
			wantURIs: []string{"spiffe://example.test/node/n1"},
			wantOU:   []string{"worker"}, wantSite: []string{"ams1"},
		},
		{
			name: "a TPM-certified node certificate names the AK in an extension, not a URI SAN",
			role: "worker", ak: ak,
			wantURIs: []string{"spiffe://example.test/node/n1"},
			wantOU:   []string{"worker"},
		},
		{
			name:     "a node without role or site has neither",
			wantURIs: []string{"spiffe://example.test/node/n1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := mustKey(t)
			c := issueLeaf(t, a.Issuer, key, "n1", tt.role, tt.site, tt.ak)

			var uris []string
			for _, u := range c.URIs {
				uris = append(uris, u.String())
			}
			if !slices.Equal(uris, tt.wantURIs) {
				t.Errorf("URIs = %q, want %q", uris, tt.wantURIs)
			}
			if c.Subject.CommonName != "n1" || !slices.Equal(c.Subject.Organization, []string{testTD}) ||
				!slices.Equal(c.Subject.OrganizationalUnit, tt.wantOU) || !slices.Equal(c.Subject.Locality, tt.wantSite) {
				t.Errorf("subject = %v", c.Subject)
			}
			if len(c.DNSNames) != 0 || len(c.IPAddresses) != 0 || len(c.EmailAddresses) != 0 {
				t.Errorf("unexpected SANs: %v %v %v", c.DNSNames, c.IPAddresses, c.EmailAddresses)
			}
			if c.KeyUsage != x509.KeyUsageDigitalSignature {
				t.Errorf("KeyUsage = %v", c.KeyUsage)
			}
			if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}) {
				t.Errorf("ExtKeyUsage = %v", c.ExtKeyUsage)
			}
			if c.IsCA || c.SerialNumber.Sign() <= 0 || c.SerialNumber.BitLen() > 128 {
				t.Errorf("IsCA %v, serial %v", c.IsCA, c.SerialNumber)
			}
			if !key.PublicKey.Equal(c.PublicKey) {
				t.Error("leaf certifies another key")
			}
			if err := c.CheckSignatureFrom(a.NodeCA); err != nil {
				t.Errorf("leaf not signed by node CA: %v", err)
			}
			// go-spiffe takes it as an X.509-SVID of its node.
			id := verifySVID(t, a, c, testNow)
			if id.String() != "spiffe://example.test/node/n1" {
				t.Errorf("x509svid reads SPIFFE ID %s", id)
			}
			ext := findExtension(c, OIDTPMAKName)
			switch {
			case tt.ak == nil && ext != nil:
				t.Error("a certificate without an AK carries the AK extension")
			case tt.ak != nil && (ext == nil || ext.Critical):
				t.Errorf("the AK extension is %+v, want one, not critical", ext)
			}

			info, err := ParseNodeCert(c)
			if err != nil {
				t.Fatalf("ParseNodeCert: %v", err)
			}
			want := NodeCertInfo{NodeID: "n1", TrustDomain: testTD, SPIFFEID: "spiffe://example.test/node/n1",
				Role: tt.role, Site: tt.site, TPMAKName: tt.ak}
			if info.NodeID != want.NodeID || info.TrustDomain != want.TrustDomain || info.SPIFFEID != want.SPIFFEID ||
				info.Role != want.Role || info.Site != want.Site || !bytes.Equal(info.TPMAKName, want.TPMAKName) || info.LegacyAKURN {
				t.Errorf("ParseNodeCert = %+v, want %+v", info, want)
			}
		})
	}
}

func TestParseNodeCertReadsTheLegacyAKURN(t *testing.T) {
	a, _ := newAuthority(t, "")
	c := signWithNodeCA(t, a, &x509.Certificate{
		Subject:  pkix.Name{CommonName: "n1", Organization: []string{testTD}, OrganizationalUnit: []string{"worker"}},
		URIs:     mustURIs(t, "spiffe://example.test/node/n1", "urn:nodetrust:tpm-ak:000bdeadbeef"),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	info, err := ParseNodeCert(c)
	if err != nil {
		t.Fatalf("a certificate of the old form does not parse: %v", err)
	}
	if !bytes.Equal(info.TPMAKName, []byte{0, 0xb, 0xde, 0xad, 0xbe, 0xef}) || !info.LegacyAKURN || info.NodeID != "n1" {
		t.Errorf("ParseNodeCert of the old form = %+v", info)
	}
	// The old form is why the new one exists: go-spiffe refuses it.
	if _, err := x509svid.IDFromCert(c); err == nil || !strings.Contains(err.Error(), "more than one URI SAN") {
		t.Errorf("x509svid.IDFromCert of the old form: %v, want more than one URI SAN", err)
	}
	// Its renewal, which reissues with the name ParseNodeCert read, is an
	// X.509-SVID.
	next := issueLeaf(t, a.Issuer, mustKey(t), info.NodeID, info.Role, info.Site, info.TPMAKName)
	verifySVID(t, a, next, testNow)
	if again, err := ParseNodeCert(next); err != nil || again.LegacyAKURN || !bytes.Equal(again.TPMAKName, info.TPMAKName) {
		t.Errorf("the reissued certificate parses as %+v, %v", again, err)
	}
}

func TestIssueSerialsDiffer(t *testing.T) {
	a, _ := newAuthority(t, "")
	k := mustKey(t)
	c1 := issueLeaf(t, a.Issuer, k, "n1", "worker", "", nil)
	c2 := issueLeaf(t, a.Issuer, k, "n1", "worker", "", nil)
	if c1.SerialNumber.Cmp(c2.SerialNumber) == 0 {
		t.Error("two certificates share a serial")
	}
}

// TestIssueLeafFieldsMatchTheParse checks that each field IssueLeaf sets
// without parsing is what parsing its DER gives, validity times with
// fractions of a second and clamped to the CA's included: the server
// renews on those fields alone.
func TestIssueLeafFieldsMatchTheParse(t *testing.T) {
	a, _ := newAuthority(t, "")
	now := time.Now() // with nanoseconds and a monotonic reading
	for _, r := range []LeafRequest{
		{NodeID: "n1", Role: "worker", NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour)},
		{NodeID: "n2", Site: "ams1", TPMAKName: []byte{0x00, 0x0b, 0x01},
			NotBefore: a.NodeCA.NotBefore.Add(-time.Hour), NotAfter: a.NodeCA.NotAfter.Add(time.Hour)},
	} {
		key := mustKey(t)
		r.PublicKey = key.Public()
		l, err := a.Issuer.IssueLeaf(r)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(l.Raw)
		if err != nil {
			t.Fatal(err)
		}
		if l.SerialNumber.Cmp(c.SerialNumber) != 0 || l.SerialHex() != SerialHex(c) {
			t.Errorf("%s: serial %s (%s), parsed %s", r.NodeID, l.SerialNumber, l.SerialHex(), c.SerialNumber)
		}
		if !l.NotBefore.Equal(c.NotBefore) || !l.NotAfter.Equal(c.NotAfter) ||
			l.NotBefore.Location() != time.UTC || l.NotAfter.Location() != time.UTC {
			t.Errorf("%s: validity %v..%v, parsed %v..%v", r.NodeID, l.NotBefore, l.NotAfter, c.NotBefore, c.NotAfter)
		}
		if !key.PublicKey.Equal(l.PublicKey) || !key.PublicKey.Equal(c.PublicKey) {
			t.Errorf("%s: public key %v, parsed %v", r.NodeID, l.PublicKey, c.PublicKey)
		}
	}
}

func TestIssueClampsValidity(t *testing.T) {
	a, _ := newAuthority(t, "")
	c, err := a.Issuer.Issue(LeafRequest{
		PublicKey: mustKey(t).Public(), NodeID: "n1", Role: "worker",
		NotBefore: a.NodeCA.NotBefore.Add(-time.Hour), NotAfter: a.NodeCA.NotAfter.Add(time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !c.NotBefore.Equal(a.NodeCA.NotBefore) || !c.NotAfter.Equal(a.NodeCA.NotAfter) {
		t.Errorf("validity %v..%v, want the CA's %v..%v", c.NotBefore, c.NotAfter, a.NodeCA.NotBefore, a.NodeCA.NotAfter)
	}
}

func TestIssueRefuses(t *testing.T) {
	a, _ := newAuthority(t, "")
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ok := LeafRequest{PublicKey: mustKey(t).Public(), NodeID: "n1", Role: "worker",
		NotBefore: testNow, NotAfter: testNow.Add(time.Hour)}
	tests := []struct {
		name, want string
		edit       func(*LeafRequest)
	}{
		{"a P-384 node key is refused", "want ECDSA P-256", func(r *LeafRequest) { r.PublicKey = p384.Public() }},
		{"a missing node key is refused", "want ECDSA P-256", func(r *LeafRequest) { r.PublicKey = nil }},
		{"an invalid node id is refused", "node id", func(r *LeafRequest) { r.NodeID = "N1" }},
		{"a role with a newline is refused", "control character", func(r *LeafRequest) { r.Role = "a\nb" }},
		{"an overlong site is refused", "site is 129 bytes", func(r *LeafRequest) { r.Site = string(make([]byte, 129)) }},
		{"a missing NotAfter is refused", "required", func(r *LeafRequest) { r.NotAfter = time.Time{} }},
		{"a validity after the CA's is empty", "is empty inside the CA's", func(r *LeafRequest) {
			r.NotBefore, r.NotAfter = a.NodeCA.NotAfter.Add(time.Hour), a.NodeCA.NotAfter.Add(2*time.Hour)
		}},
		{"NotAfter before NotBefore is empty", "is empty", func(r *LeafRequest) { r.NotAfter = r.NotBefore.Add(-time.Second) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			_, err := a.Issuer.Issue(r)
			wantErr(t, err, nil, tt.want)
		})
	}
}

func TestNewIssuerRefuses(t *testing.T) {
	a, _ := newAuthority(t, "")
	nodeKey := a.Issuer.key
	leaf := issueLeaf(t, a.Issuer, mustKey(t), "n1", "", "", nil)
	tests := []struct {
		name, want string
		ca         *x509.Certificate
		key        crypto.Signer
		chain      []*x509.Certificate
		td         string
	}{
		{"a key of another CA is refused", "key does not match", a.NodeCA, mustKey(t), nil, testTD},
		{"a leaf is not a CA", "is not a CA", leaf, nodeKey, nil, testTD},
		{"a chain not starting with the CA is refused", "does not start with the CA", a.NodeCA, nodeKey, []*x509.Certificate{a.ServingCA}, testTD},
		{"a chain whose links do not sign each other is refused", "is not signed by", a.NodeCA, nodeKey, []*x509.Certificate{a.NodeCA, a.ServingCA}, testTD},
		{"an invalid trust domain is refused", "trust domain", a.NodeCA, nodeKey, nil, "Bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewIssuer(tt.ca, tt.key, tt.chain, tt.td)
			wantErr(t, err, nil, tt.want)
		})
	}
	t.Run("a chain ending below the root is accepted", func(t *testing.T) {
		iss, err := NewIssuer(a.NodeCA, nodeKey, []*x509.Certificate{a.NodeCA, a.Root}, testTD)
		if err != nil {
			t.Fatal(err)
		}
		if got := iss.Chain(); len(got) != 2 || !got[0].Equal(a.NodeCA) {
			t.Errorf("Chain() = %d certificates", len(got))
		}
	})
}

// signWithNodeCA makes a certificate under the node CA from a free-form
// template, for ParseNodeCert's refusals.
func signWithNodeCA(t *testing.T, a *Authority, tmpl *x509.Certificate) *x509.Certificate {
	t.Helper()
	tmpl.SerialNumber = mustSerial(t)
	tmpl.NotBefore, tmpl.NotAfter = testNow, testNow.Add(time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.NodeCA, mustKey(t).Public(), a.Issuer.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustSerial(t *testing.T) *big.Int {
	t.Helper()
	n, err := randomSerial()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func mustURIs(t *testing.T, ss ...string) []*url.URL {
	t.Helper()
	var out []*url.URL
	for _, s := range ss {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

func TestParseNodeCertRefuses(t *testing.T) {
	a, _ := newAuthority(t, "")
	subj := pkix.Name{CommonName: "n1", Organization: []string{testTD}}
	node := "spiffe://example.test/node/n1"
	tests := []struct {
		name, want string
		tmpl       *x509.Certificate
	}{
		{"a certificate without a spiffe URI is refused", "no spiffe URI",
			&x509.Certificate{Subject: subj}},
		{"two spiffe URIs are refused", "more than one spiffe URI",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node, "spiffe://example.test/node/n2")}},
		{"an admin SPIFFE ID is not a node's", "is not of the form",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, "spiffe://example.test/admin/owner")}},
		{"a nested path is refused", "is not of the form",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, "spiffe://example.test/node/n1/x")}},
		{"a query is refused", "spiffe URI",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node+"?x=1")}},
		{"a port is refused", "trust domain",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, "spiffe://example.test:8443/node/n1")}},
		{"a common name other than the node id is refused", `common name "n2"`,
			&x509.Certificate{Subject: pkix.Name{CommonName: "n2", Organization: []string{testTD}}, URIs: mustURIs(t, node)}},
		{"an organization other than the trust domain is refused", "is not the trust domain",
			&x509.Certificate{Subject: pkix.Name{CommonName: "n1", Organization: []string{"other.test"}}, URIs: mustURIs(t, node)}},
		{"two roles are refused", "2 roles",
			&x509.Certificate{Subject: pkix.Name{CommonName: "n1", Organization: []string{testTD}, OrganizationalUnit: []string{"a", "b"}}, URIs: mustURIs(t, node)}},
		{"two TPM AK URNs are refused", "more than one TPM AK URN",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node, "urn:nodetrust:tpm-ak:00", "urn:nodetrust:tpm-ak:01")}},
		{"upper-case AK hex is refused", "lower-case hex",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node, "urn:nodetrust:tpm-ak:0A")}},
		{"odd-length AK hex is refused", "TPM AK URN",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node, "urn:nodetrust:tpm-ak:abc")}},
		{"an empty AK name is refused", "TPM AK URN",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node, "urn:nodetrust:tpm-ak:")}},
		{"an AK named by both the URN and the extension is refused", "named twice",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node, "urn:nodetrust:tpm-ak:00"), ExtraExtensions: []pkix.Extension{akExt(t, []byte{0, 1})}}},
		{"an empty AK extension is refused", "TPM AK name extension",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node), ExtraExtensions: []pkix.Extension{akExt(t, []byte{})}}},
		{"an AK extension that is no OCTET STRING is refused", "TPM AK name extension",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node), ExtraExtensions: []pkix.Extension{{Id: OIDTPMAKName, Value: []byte{0x05, 0x00}}}}},
		{"a second URI SAN of another kind is refused", "only URI SAN",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node, "https://example.test/")}},
		{"a CA certificate is refused", "is a CA",
			&x509.Certificate{Subject: subj, URIs: mustURIs(t, node), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseNodeCert(signWithNodeCA(t, a, tt.tmpl))
			wantErr(t, err, nil, tt.want)
		})
	}
}

// akExt is the AK name extension holding name.
func akExt(t *testing.T, name []byte) pkix.Extension {
	t.Helper()
	v, err := asn1.Marshal(name)
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: OIDTPMAKName, Value: v}
}

func findExtension(c *x509.Certificate, oid asn1.ObjectIdentifier) *pkix.Extension {
	for i := range c.Extensions {
		if c.Extensions[i].Id.Equal(oid) {
			return &c.Extensions[i]
		}
	}
	return nil
}

// verifySVID parses and verifies leaf (with the node CA after it) as an
// X.509-SVID with go-spiffe's x509svid against the authority's root, and
// returns its SPIFFE ID.
func verifySVID(t *testing.T, a *Authority, leaf *x509.Certificate, now time.Time) spiffeid.ID {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString(a.TrustDomain)
	bundle := x509bundle.FromX509Authorities(td, []*x509.Certificate{a.Root})
	id, _, err := x509svid.ParseAndVerify([][]byte{leaf.Raw, a.NodeCA.Raw}, bundle, x509svid.WithTime(now))
	if err != nil {
		t.Fatalf("x509svid does not take the node certificate: %v", err)
	}
	return id
}

func TestAdminIdentity(t *testing.T) {
	a, dir := newAuthority(t, "")
	owner, err := ReadCerts(Path(dir, OwnerCertFile))
	if err != nil {
		t.Fatal(err)
	}
	node := issueLeaf(t, a.Issuer, mustKey(t), "n1", "", "", nil)
	two := signWithNodeCA(t, a, &x509.Certificate{URIs: mustURIs(t, "spiffe://example.test/admin/owner", "spiffe://example.test/admin/ops")})
	tests := []struct {
		name   string
		cert   *x509.Certificate
		td     string
		want   string
		wantOK bool
	}{
		{"the owner credential is the owner", owner[0], testTD, "owner", true},
		{"the owner of another trust domain is nobody", owner[0], "other.test", "", false},
		{"a node certificate is no admin", node, testTD, "", false},
		{"two admin URIs are no admin", two, testTD, "", false},
		{"no certificate is no admin", nil, testTD, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := AdminIdentity(tt.cert, tt.td)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("AdminIdentity = %q, %v; want %q, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}
