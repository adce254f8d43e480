package joinresponse

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
)

// Label starts the data whose SHA-256 a join response's
// signature covers: label || 0x00 || payload.
const Label = "nodetrust join-response v1"

// Bounds on what a join result may carry.
const (
	maxResultChain = 8
	maxResultRoots = 16
)

// Digest returns SHA-256("nodetrust join-response v1" || 0x00 ||
// payload), the digest a SignedJoinResult's signature covers.
func Digest(payload []byte) []byte { return labelledDigest(Label, payload) }

// labelledDigest is SHA-256(label || 0x00 || payload): each kind of signed
// result has its own label, so one never verifies as another.
func labelledDigest(label string, payload []byte) []byte {
	h := sha256.New()
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write(payload)
	return h.Sum(nil)
}

// Sign serializes r (deterministic protobuf encoding) and signs
// it with the JoinService signing key, an ECDSA key: the signature is IEEE
// P1363 over [Digest] of the payload, kid is the pin of the
// signer's public key and signing_key its SubjectPublicKeyInfo DER.
func Sign(signer crypto.Signer, r *joinv1.JoinResult) (*joinv1.SignedJoinResult, error) {
	if r == nil {
		return nil, errors.New("sign join result: signer and result are required")
	}
	return signLabelled(signer, r, Label, "join result")
}

// signLabelled serializes m (deterministic protobuf encoding) and signs it
// with signer over labelledDigest(label, payload); what names the result in
// errors.
func signLabelled(signer crypto.Signer, m proto.Message, label, what string) (*joinv1.SignedJoinResult, error) {
	if signer == nil {
		return nil, fmt.Errorf("sign %s: signer and result are required", what)
	}
	spki, kid, err := signingKeyDER(signer.Public())
	if err != nil {
		return nil, fmt.Errorf("sign %s: signing key: %w", what, err)
	}
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("sign %s: marshal: %w", what, err)
	}
	sig, err := pki.SignP1363(signer, labelledDigest(label, payload))
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", what, err)
	}
	return &joinv1.SignedJoinResult{
		Payload:    payload,
		Signature:  sig,
		Kid:        kid,
		SigningKey: spki,
	}, nil
}

// lastSigningKey is the SubjectPublicKeyInfo DER and the kid of the last
// key that signed: a server signs every result with its one JoinService
// key, and encoding that key again for each result cost about a sixth of a
// renewal's response signature.
var lastSigningKey atomic.Pointer[signingKeyCache]

type signingKeyCache struct {
	pub  crypto.PublicKey
	spki []byte
	kid  string
}

// signingKeyDER returns pub's SubjectPublicKeyInfo DER (a copy the
// caller owns) and its pin as a kid, from lastSigningKey when pub is
// that key.
func signingKeyDER(pub crypto.PublicKey) ([]byte, string, error) {
	if c := lastSigningKey.Load(); c != nil {
		if k, ok := pub.(interface{ Equal(crypto.PublicKey) bool }); ok && k.Equal(c.pub) {
			return slices.Clone(c.spki), c.kid, nil
		}
	}
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, "", err
	}
	c := &signingKeyCache{pub: pub, spki: spki, kid: pki.PinOfSPKI(spki).String()}
	lastSigningKey.Store(c)
	return slices.Clone(spki), c.kid, nil
}

// signingKey checks that s names the trusted signing key by pin (its
// SubjectPublicKeyInfo and its kid) and returns that ECDSA key; refuse
// words a refusal for the caller's kind of response.
func signingKey(s *joinv1.SignedJoinResult, pin pki.Pin, refuse func(string, ...any) error) (*ecdsa.PublicKey, error) {
	if got := pki.PinOfSPKI(s.GetSigningKey()); !got.Equal(pin) {
		return nil, refuse("signing key pin %s is not the trusted join signing key pin %s", got, pin)
	}
	if kid, err := pki.ParsePin(s.GetKid()); err != nil || !kid.Equal(pin) {
		return nil, refuse("kid %s is not the trusted join signing key pin %s", quoteShort(s.GetKid()), pin)
	}
	key, err := x509.ParsePKIXPublicKey(s.GetSigningKey())
	if err != nil {
		return nil, refuse("signing key: %v", err)
	}
	ek, ok := key.(*ecdsa.PublicKey)
	if !ok {
		return nil, refuse("signing key is %T, want ECDSA", key)
	}
	return ek, nil
}

// Expect is what a node knows before it reads a join response: the pin it
// trusts and the request it sent.
type Expect struct {
	// SigningKeyPin is the trusted join_signing_key_pin. Required.
	SigningKeyPin pki.Pin
	// CSRSHA256 is the SHA-256 of the CSR the node sent. Required.
	CSRSHA256 []byte
	// PublicKey is the node key that CSR certified. Required.
	PublicKey crypto.PublicKey
	// TrustDomain, NodeID and Role, when set, must equal the result's;
	// empty accepts what the result says.
	TrustDomain string
	NodeID      string
	Role        string
	// Now is the time at which the chain is verified; zero means time.Now().
	Now time.Time
}

// Opened is a join result that passed every check of [Open].
type Opened struct {
	Result *joinv1.JoinResult
	// Leaf is Chain[0], the node certificate.
	Leaf *x509.Certificate
	// Chain is the node's chain, leaf first, root excluded.
	Chain []*x509.Certificate
	// Roots is the trust bundle the result carried.
	Roots []*x509.Certificate
	// Info is the identity in Leaf.
	Info pki.NodeCertInfo
}

// ErrRefused means a signed join response failed one of the checks of
// [Open]; the wrapping message names the check.
var ErrRefused = errors.New("join response refused")

// refuse wraps ErrRefused with what mismatched.
func refuse(format string, a ...any) error {
	return fmt.Errorf("open join response: %s: %w", fmt.Sprintf(format, a...), ErrRefused)
}

// Open verifies a signed join response, in this order, and
// returns its content. Each failure is a distinct error naming the check
// and wrapping [ErrRefused]:
//
//   - signing_key's pin equals e.SigningKeyPin, and kid equals that pin;
//   - the signature verifies under signing_key;
//   - the payload is a JoinResult;
//   - its csr_sha256 equals e.CSRSHA256 (constant time);
//   - the leaf (chain[0]) certifies e.PublicKey;
//   - the chain verifies to the result's roots for client authentication
//     at e.Now;
//   - the leaf's SPIFFE ID equals spiffe_id, which equals
//     pki.NodeSPIFFEID(trust_domain, node_id);
//   - trust domain, node id and role equal e's where e sets them;
//   - the leaf's role and site equal the result's.
func Open(s *joinv1.SignedJoinResult, e Expect) (*Opened, error) {
	if s == nil {
		return nil, refuse("no signed result")
	}
	if e.SigningKeyPin.IsZero() {
		return nil, errors.New("open join response: expected signing key pin is not set")
	}
	if len(e.CSRSHA256) != sha256.Size {
		return nil, fmt.Errorf("open join response: expected CSR hash is %d bytes, want %d", len(e.CSRSHA256), sha256.Size)
	}
	if e.PublicKey == nil {
		return nil, errors.New("open join response: expected node public key is not set")
	}

	// The signer.
	ek, err := signingKey(s, e.SigningKeyPin, refuse)
	if err != nil {
		return nil, err
	}
	if !pki.VerifyP1363(ek, Digest(s.GetPayload()), s.GetSignature()) {
		return nil, refuse("signature does not verify under the join signing key")
	}

	// The content.
	r := new(joinv1.JoinResult)
	if err := proto.Unmarshal(s.GetPayload(), r); err != nil {
		return nil, refuse("payload is not a JoinResult: %v", err)
	}
	if subtle.ConstantTimeCompare(r.GetCsrSha256(), e.CSRSHA256) != 1 {
		return nil, refuse("csr_sha256 is not this request's CSR hash")
	}
	chain, err := parseDERs("chain", r.GetChain(), maxResultChain)
	if err != nil {
		return nil, refuse("%v", err)
	}
	roots, err := parseDERs("roots", r.GetRoots(), maxResultRoots)
	if err != nil {
		return nil, refuse("%v", err)
	}
	leaf := chain[0]
	if !sameKey(leaf.PublicKey, e.PublicKey) {
		return nil, refuse("leaf certificate certifies another key than this request's")
	}
	now := e.Now
	if now.IsZero() {
		now = time.Now()
	}
	opts := x509.VerifyOptions{
		Roots:         x509.NewCertPool(),
		Intermediates: x509.NewCertPool(),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, c := range roots {
		opts.Roots.AddCert(c)
	}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(opts); err != nil {
		return nil, refuse("chain does not verify to the result's roots: %v", err)
	}

	// The identity.
	info, err := pki.ParseNodeCert(leaf)
	if err != nil {
		return nil, refuse("leaf: %v", err)
	}
	if info.SPIFFEID != r.GetSpiffeId() {
		return nil, refuse("leaf SPIFFE ID %q is not the result's spiffe_id %q", info.SPIFFEID, r.GetSpiffeId())
	}
	if want := pki.NodeSPIFFEID(r.GetTrustDomain(), r.GetNodeId()); r.GetSpiffeId() != want {
		return nil, refuse("spiffe_id %q is not %q made of trust_domain and node_id", r.GetSpiffeId(), want)
	}
	if e.TrustDomain != "" && r.GetTrustDomain() != e.TrustDomain {
		return nil, refuse("trust domain %q is not the expected %q", r.GetTrustDomain(), e.TrustDomain)
	}
	if e.NodeID != "" && r.GetNodeId() != e.NodeID {
		return nil, refuse("node id %q is not the expected %q", r.GetNodeId(), e.NodeID)
	}
	if e.Role != "" && r.GetRole() != e.Role {
		return nil, refuse("role %q is not the expected %q", r.GetRole(), e.Role)
	}
	if info.Role != r.GetRole() {
		return nil, refuse("leaf role %q is not the result's role %q", info.Role, r.GetRole())
	}
	if info.Site != r.GetSite() {
		return nil, refuse("leaf site %q is not the result's site %q", info.Site, r.GetSite())
	}
	return &Opened{Result: r, Leaf: leaf, Chain: chain, Roots: roots, Info: info}, nil
}

// parseDERs parses between 1 and max DER certificates.
func parseDERs(what string, ders [][]byte, max int) ([]*x509.Certificate, error) {
	if len(ders) == 0 {
		return nil, fmt.Errorf("%s is empty", what)
	}
	if len(ders) > max {
		return nil, fmt.Errorf("%s has %d certificates, more than %d", what, len(ders), max)
	}
	certs := make([]*x509.Certificate, len(ders))
	for i, der := range ders {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%s certificate %d: %w", what, i, err)
		}
		certs[i] = c
	}
	return certs, nil
}

// sameKey reports whether a and b are the same public key.
func sameKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && b != nil && k.Equal(b)
}

// quoteShort quotes an untrusted string for an error message, cut to a
// readable length.
func quoteShort(s string) string {
	const max = 80
	if len(s) > max {
		return fmt.Sprintf("%q...", s[:max])
	}
	return fmt.Sprintf("%q", s)
}
