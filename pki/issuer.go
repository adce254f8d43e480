package pki

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"
	"unicode/utf8"
)

// Limits on the role and site carried in a node certificate (the X.520
// upper bound for an organizational unit name, and a generous one for a
// locality).
const (
	MaxRoleLen = 64
	MaxSiteLen = 128
	// maxTPMNameLen bounds a TPM name: a 2-byte algorithm and a SHA-512 digest.
	maxTPMNameLen = 2 + 64
)

// Issuer signs node certificates with the node-issuing CA. An Issuer does
// not change after [NewIssuer] and is safe for concurrent use.
type Issuer struct {
	ca          *x509.Certificate
	key         crypto.Signer
	chain       []*x509.Certificate
	trustDomain string
}

// NewIssuer returns an Issuer for the CA certificate ca and its key.
// chain is what follows a leaf in a presented chain: ca first, then any
// intermediates above it, without the root; an empty chain means [ca].
// NewIssuer checks that key matches ca, that ca may sign certificates,
// that chain starts with ca and that each certificate of chain is signed
// by the next, and that trustDomain is valid.
func NewIssuer(ca *x509.Certificate, key crypto.Signer, chain []*x509.Certificate, trustDomain string) (*Issuer, error) {
	if ca == nil || key == nil {
		return nil, errors.New("new issuer: CA certificate and key are required")
	}
	if err := ValidTrustDomain(trustDomain); err != nil {
		return nil, fmt.Errorf("new issuer: %w", err)
	}
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("new issuer: %q is not a CA allowed to sign certificates", ca.Subject.CommonName)
	}
	if !publicKeysEqual(key.Public(), ca.PublicKey) {
		return nil, fmt.Errorf("new issuer: key does not match CA certificate %q", ca.Subject.CommonName)
	}
	if len(chain) == 0 {
		chain = []*x509.Certificate{ca}
	}
	if !bytes.Equal(chain[0].Raw, ca.Raw) {
		return nil, errors.New("new issuer: chain does not start with the CA certificate")
	}
	for i := 0; i+1 < len(chain); i++ {
		if err := chain[i].CheckSignatureFrom(chain[i+1]); err != nil {
			return nil, fmt.Errorf("new issuer: chain certificate %d is not signed by certificate %d: %w", i, i+1, err)
		}
	}
	return &Issuer{
		ca:          ca,
		key:         key,
		chain:       append([]*x509.Certificate(nil), chain...),
		trustDomain: trustDomain,
	}, nil
}

// TrustDomain returns the trust domain the Issuer names in certificates.
func (i *Issuer) TrustDomain() string { return i.trustDomain }

// CA returns the issuing CA certificate.
func (i *Issuer) CA() *x509.Certificate { return i.ca }

// Chain returns the CA chain to append after an issued leaf (the issuing CA
// first, the root excluded). The caller may modify the returned slice.
func (i *Issuer) Chain() []*x509.Certificate {
	return append([]*x509.Certificate(nil), i.chain...)
}

// LeafRequest is what [Issuer.Issue] puts in a node certificate. The caller
// has already decided every field: nothing here comes from the CSR but the
// public key.
type LeafRequest struct {
	// PublicKey is the node key; it must be an *ecdsa.PublicKey on P-256.
	PublicKey crypto.PublicKey
	// NodeID must pass [ValidNodeID].
	NodeID string
	// Role goes into the subject's OrganizationalUnit; empty leaves it out.
	// At most MaxRoleLen bytes of printable UTF-8.
	Role string
	// Site goes into the subject's Locality; empty leaves it out.
	// At most MaxSiteLen bytes of printable UTF-8.
	Site string
	// TPMAKName, when set, is the TPM name of the attestation key that
	// certified PublicKey; it adds the non-critical extension
	// [OIDTPMAKName].
	TPMAKName []byte
	// NotBefore and NotAfter bound the certificate. They are clamped into
	// the CA's own validity; the result must still be a non-empty interval.
	NotBefore, NotAfter time.Time
}

// Issue signs a node certificate: a random positive 128-bit serial; subject
// CommonName = node id, OrganizationalUnit = [role], Locality = [site],
// Organization = [trust domain]; the SPIFFE ID spiffe://<td>/node/<id> as
// the only URI SAN (an X.509-SVID, built with go-spiffe); when TPMAKName is
// set, the non-critical extension [OIDTPMAKName]; no DNS names; key usage
// DigitalSignature; extended key usages ClientAuth and ServerAuth.
// Lifetime policy (at most 24 h, 2 h for ramdisk nodes) is the caller's.
// It returns the certificate parsed back; IssueLeaf is Issue without the
// parse.
func (i *Issuer) Issue(r LeafRequest) (*x509.Certificate, error) {
	l, err := i.IssueLeaf(r)
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(l.Raw)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: parse: %w", r.NodeID, err)
	}
	return c, nil
}

// IssuedLeaf is a node certificate IssueLeaf signed: its DER and the
// fields a server reads of it next, taken from what was signed rather
// than parsed back from the DER (a parse costs about a third of the
// signature). Each field equals the parsed certificate's.
type IssuedLeaf struct {
	Raw          []byte
	SerialNumber *big.Int
	// NotBefore and NotAfter are in UTC, whole seconds, as encoded.
	NotBefore, NotAfter time.Time
	PublicKey           crypto.PublicKey
}

// SerialHex is the leaf's serial number as the control plane records it
// (see the function SerialHex).
func (l *IssuedLeaf) SerialHex() string { return serialHex(l.SerialNumber) }

// IssueLeaf is Issue returning the certificate as an IssuedLeaf, for the
// server's hot paths, which need its DER and a few fields but never the
// parsed certificate.
func (i *Issuer) IssueLeaf(r LeafRequest) (*IssuedLeaf, error) {
	if !isP256(r.PublicKey) {
		return nil, fmt.Errorf("issue certificate: node key is %T, want ECDSA P-256", r.PublicKey)
	}
	if err := ValidNodeID(r.NodeID); err != nil {
		return nil, fmt.Errorf("issue certificate: %w", err)
	}
	if err := validName("role", r.Role, MaxRoleLen); err != nil {
		return nil, fmt.Errorf("issue certificate for %s: %w", r.NodeID, err)
	}
	if err := validName("site", r.Site, MaxSiteLen); err != nil {
		return nil, fmt.Errorf("issue certificate for %s: %w", r.NodeID, err)
	}
	if len(r.TPMAKName) > maxTPMNameLen {
		return nil, fmt.Errorf("issue certificate for %s: TPM AK name is %d bytes, more than %d", r.NodeID, len(r.TPMAKName), maxTPMNameLen)
	}
	if r.NotBefore.IsZero() || r.NotAfter.IsZero() {
		return nil, fmt.Errorf("issue certificate for %s: NotBefore and NotAfter are required", r.NodeID)
	}
	notBefore, notAfter := r.NotBefore, r.NotAfter
	if notBefore.Before(i.ca.NotBefore) {
		notBefore = i.ca.NotBefore
	}
	if notAfter.After(i.ca.NotAfter) {
		notAfter = i.ca.NotAfter
	}
	if !notAfter.After(notBefore) {
		return nil, fmt.Errorf("issue certificate for %s: validity %s to %s is empty inside the CA's %s to %s",
			r.NodeID, r.NotBefore.UTC().Format(time.RFC3339), r.NotAfter.UTC().Format(time.RFC3339),
			i.ca.NotBefore.UTC().Format(time.RFC3339), i.ca.NotAfter.UTC().Format(time.RFC3339))
	}

	spiffe, err := NodeID(i.trustDomain, r.NodeID)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: SPIFFE ID: %w", r.NodeID, err)
	}
	var exts []pkix.Extension
	if len(r.TPMAKName) > 0 {
		ext, err := tpmAKNameExtension(r.TPMAKName)
		if err != nil {
			return nil, fmt.Errorf("issue certificate for %s: %w", r.NodeID, err)
		}
		exts = append(exts, ext)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: %w", r.NodeID, err)
	}
	subject := pkix.Name{
		CommonName:   r.NodeID,
		Organization: []string{i.trustDomain},
	}
	if r.Role != "" {
		subject.OrganizationalUnit = []string{r.Role}
	}
	if r.Site != "" {
		subject.Locality = []string{r.Site}
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{spiffe.URL()},
		ExtraExtensions:       exts,
	}
	der, err := i.signLeaf(tmpl, r.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: %w", r.NodeID, err)
	}
	return &IssuedLeaf{Raw: der, SerialNumber: serial, PublicKey: r.PublicKey,
		NotBefore: encodedTime(notBefore), NotAfter: encodedTime(notAfter)}, nil
}

// encodedTime is t as a certificate's validity encodes it, and parsing
// gives it back: UTC, whole seconds.
func encodedTime(t time.Time) time.Time { return t.UTC().Truncate(time.Second) }

// randomSerial returns a uniformly random positive serial of at most 128
// bits.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

// validName checks an optional role or site: valid UTF-8 of at most max
// bytes, with no control characters.
func validName(what, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%s is %d bytes, more than %d", what, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("%s %q holds a control character", what, s)
		}
	}
	return nil
}
