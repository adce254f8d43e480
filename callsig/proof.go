package callsig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/pki"
)

// Labels that start the signed bytes of boot statements and endorsements,
// each followed by one zero byte.
const (
	BootStatementLabel = "nodetrust callsig boot-statement v1"
	EndorsementLabel   = "nodetrust callsig endorsement v1"
)

// MachineProofVersion is the first byte of a machine proof's wire encoding.
const MachineProofVersion byte = 1

// Limits of machine proofs.
const (
	// MaxChainCerts is the most certificates a proof's chain may hold.
	MaxChainCerts = 8
	// MaxCertLen is the longest certificate (DER) a proof may hold.
	MaxCertLen = 16 << 10
	// MaxBootIDLen is the longest boot id.
	MaxBootIDLen = 255
	// StatementSigSize is the size of a boot statement's signature: IEEE
	// P1363 r||s for ECDSA P-256.
	StatementSigSize = 64
)

// MaxMachineProofLen is the length of the longest valid machine proof
// encoding.
const MaxMachineProofLen = 1 + lenSize + MaxChainCerts*(lenSize+MaxCertLen) +
	4*lenSize + MaxNamespaceLen + pki.MaxNodeIDLen + MaxBootIDLen + ed25519.PublicKeySize +
	lenSize + StatementSigSize +
	5*lenSize + MaxNamespaceLen + pki.MaxNodeIDLen + MaxBootIDLen + MaxSenderLen + ed25519.PublicKeySize +
	lenSize + ed25519.SignatureSize

// BootStatement is what a daemon states at each boot, signed with the key of
// its node certificate: in this namespace, node NodeID, in the boot BootID,
// signs with BootPublicKey.
type BootStatement struct {
	Namespace string
	// NodeID is the node id of the daemon's node certificate.
	NodeID string
	// BootID is the instance id of the boot.
	BootID string
	// BootPublicKey is the boot's Ed25519 public key; the boot's private
	// key stays in the daemon's memory.
	BootPublicKey ed25519.PublicKey
}

func (s *BootStatement) check() error {
	const what = "boot statement"
	if err := checkLen(what, "namespace", len(s.Namespace), 1, MaxNamespaceLen); err != nil {
		return err
	}
	if err := checkLen(what, "node id", len(s.NodeID), 1, pki.MaxNodeIDLen); err != nil {
		return err
	}
	if err := checkLen(what, "boot id", len(s.BootID), 1, MaxBootIDLen); err != nil {
		return err
	}
	return checkLen(what, "boot public key", len(s.BootPublicKey), ed25519.PublicKeySize, ed25519.PublicKeySize)
}

// appendBody appends F(namespace) F(node_id) F(boot_id) F(boot_public_key).
func (s *BootStatement) appendBody(dst []byte) []byte {
	dst = appendField(dst, s.Namespace)
	dst = appendField(dst, s.NodeID)
	dst = appendField(dst, s.BootID)
	return appendField(dst, s.BootPublicKey)
}

// digest returns the SHA-256 the node key signs: of
// "nodetrust callsig boot-statement v1" 0x00 and the statement's fields.
func (s *BootStatement) digest() [sha256.Size]byte {
	b := append([]byte(BootStatementLabel), 0)
	return sha256.Sum256(s.appendBody(b))
}

// Sign signs the statement with the daemon's node key, which must be the
// ECDSA P-256 key of its node certificate, and returns the IEEE P1363
// signature (r||s, 64 bytes) of the SHA-256 of the statement's signed bytes
// (see docs/callsig.md). NodeID must be a valid node id: the one in the
// node certificate. A daemon signs a new statement when its certificate
// renews, since a proof carries the chain its statement was signed under.
func (s *BootStatement) Sign(nodeKey crypto.Signer) ([]byte, error) {
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	if err := pki.ValidNodeID(s.NodeID); err != nil {
		return nil, fmt.Errorf("sign boot statement: %w", err)
	}
	d := s.digest()
	sig, err := pki.SignP1363(nodeKey, d[:])
	if err != nil {
		return nil, fmt.Errorf("sign boot statement: %w", err)
	}
	if len(sig) != StatementSigSize {
		return nil, fmt.Errorf("sign boot statement: signature is %d bytes, want %d: the node key is not ECDSA P-256", len(sig), StatementSigSize)
	}
	return sig, nil
}

// Endorsement is what a daemon's boot key says of a client: in this
// namespace, on node NodeID, in the boot BootID, Sender signs with
// SenderKey. The daemon endorses the command line's key and the key of each
// instance it starts.
type Endorsement struct {
	Namespace string
	NodeID    string
	BootID    string
	// Sender is the client's id: an instance id or the command line's id.
	Sender string
	// SenderKey is the client's Ed25519 public key.
	SenderKey ed25519.PublicKey
}

func (e *Endorsement) check() error {
	const what = "endorsement"
	if err := checkLen(what, "namespace", len(e.Namespace), 1, MaxNamespaceLen); err != nil {
		return err
	}
	if err := checkLen(what, "node id", len(e.NodeID), 1, pki.MaxNodeIDLen); err != nil {
		return err
	}
	if err := checkLen(what, "boot id", len(e.BootID), 1, MaxBootIDLen); err != nil {
		return err
	}
	if err := checkLen(what, "sender", len(e.Sender), 1, MaxSenderLen); err != nil {
		return err
	}
	return checkLen(what, "sender key", len(e.SenderKey), ed25519.PublicKeySize, ed25519.PublicKeySize)
}

// appendBody appends F(namespace) F(node_id) F(boot_id) F(sender)
// F(sender_key).
func (e *Endorsement) appendBody(dst []byte) []byte {
	dst = appendField(dst, e.Namespace)
	dst = appendField(dst, e.NodeID)
	dst = appendField(dst, e.BootID)
	dst = appendField(dst, e.Sender)
	return appendField(dst, e.SenderKey)
}

// signed returns what the boot key signs: "nodetrust callsig endorsement
// v1" 0x00 and the endorsement's fields.
func (e *Endorsement) signed() []byte {
	return e.appendBody(append([]byte(EndorsementLabel), 0))
}

// Sign signs the endorsement with the boot's Ed25519 private key, whose
// public key the boot statement names, and returns the 64-byte signature of
// the endorsement's signed bytes (see docs/callsig.md).
func (e *Endorsement) Sign(bootKey ed25519.PrivateKey) ([]byte, error) {
	if err := e.check(); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	if len(bootKey) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("sign endorsement: boot key is %d bytes, want an Ed25519 private key of %d", len(bootKey), ed25519.PrivateKeySize)
	}
	return ed25519.Sign(bootKey, e.signed()), nil
}

// MachineProof travels with a call to the daemon of another machine and
// proves who sent it. All of it is untrusted until [VerifyMachineProof]
// accepts it.
type MachineProof struct {
	// Chain is the sending daemon's node certificate chain, DER, leaf
	// first, then the intermediates (the node CA); the root may be left
	// out.
	Chain [][]byte
	// Statement and StatementSig are the daemon's boot statement and its
	// signature by the leaf's key.
	Statement    BootStatement
	StatementSig []byte
	// Endorsement and EndorsementSig are the endorsement of the calling
	// client and its signature by Statement.BootPublicKey.
	Endorsement    Endorsement
	EndorsementSig []byte
}

func (p *MachineProof) check() error {
	const what = "machine proof"
	if err := checkLen(what, "chain", len(p.Chain), 1, MaxChainCerts); err != nil {
		return err
	}
	for i, c := range p.Chain {
		if err := checkLen(what, fmt.Sprintf("certificate %d", i), len(c), 1, MaxCertLen); err != nil {
			return err
		}
	}
	if err := p.Statement.check(); err != nil {
		return err
	}
	if err := checkLen(what, "statement signature", len(p.StatementSig), StatementSigSize, StatementSigSize); err != nil {
		return err
	}
	if err := p.Endorsement.check(); err != nil {
		return err
	}
	return checkLen(what, "endorsement signature", len(p.EndorsementSig), ed25519.SignatureSize, ed25519.SignatureSize)
}

// MarshalBinary returns the wire encoding of the proof:
//
//	0x01 count(4 bytes) F(cert)×count
//	F(namespace) F(node_id) F(boot_id) F(boot_public_key) F(statement_sig)
//	F(namespace) F(node_id) F(boot_id) F(sender) F(sender_key) F(endorsement_sig)
//
// The encoding is deterministic. It refuses, with an error wrapping
// [ErrMalformed], a proof with a missing, oversized or wrongly sized field.
func (p *MachineProof) MarshalBinary() ([]byte, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n := 1 + lenSize + 11*lenSize + StatementSigSize + ed25519.SignatureSize + 2*ed25519.PublicKeySize +
		len(p.Statement.Namespace) + len(p.Statement.NodeID) + len(p.Statement.BootID) +
		len(p.Endorsement.Namespace) + len(p.Endorsement.NodeID) + len(p.Endorsement.BootID) + len(p.Endorsement.Sender)
	for _, c := range p.Chain {
		n += lenSize + len(c)
	}
	b := make([]byte, 0, n)
	b = append(b, MachineProofVersion)
	b = appendUint32(b, uint32(len(p.Chain)))
	for _, c := range p.Chain {
		b = appendField(b, c)
	}
	b = p.Statement.appendBody(b)
	b = appendField(b, p.StatementSig)
	b = p.Endorsement.appendBody(b)
	return appendField(b, p.EndorsementSig), nil
}

// UnmarshalBinary decodes the wire encoding of a machine proof into p. It
// refuses, with an error wrapping [ErrMalformed], an unknown version, an
// empty chain, a missing, oversized or wrongly sized field, input that ends
// early and bytes after the last field, so a decoded proof marshals back to
// exactly data. It does not parse the certificates or verify anything: that
// is [VerifyMachineProof]'s job. p does not alias data.
func (p *MachineProof) UnmarshalBinary(data []byte) error {
	r := reader{what: "machine proof", b: data}
	r.version(MachineProofVersion)
	count := r.uint32("chain", " length")
	if r.err == nil && (count == 0 || count > MaxChainCerts) {
		r.fail("chain holds %d certificates, want 1 to %d", count, MaxChainCerts)
	}
	var chain [][]byte
	for i := 0; r.err == nil && i < int(count); i++ {
		chain = append(chain, r.field(fmt.Sprintf("certificate %d", i), 1, MaxCertLen))
	}
	var q MachineProof
	q.Statement.Namespace = r.str("statement namespace", MaxNamespaceLen)
	q.Statement.NodeID = r.str("statement node id", pki.MaxNodeIDLen)
	q.Statement.BootID = r.str("statement boot id", MaxBootIDLen)
	bootKey := r.field("boot public key", ed25519.PublicKeySize, ed25519.PublicKeySize)
	stSig := r.field("statement signature", StatementSigSize, StatementSigSize)
	q.Endorsement.Namespace = r.str("endorsement namespace", MaxNamespaceLen)
	q.Endorsement.NodeID = r.str("endorsement node id", pki.MaxNodeIDLen)
	q.Endorsement.BootID = r.str("endorsement boot id", MaxBootIDLen)
	q.Endorsement.Sender = r.str("endorsement sender", MaxSenderLen)
	senderKey := r.field("sender key", ed25519.PublicKeySize, ed25519.PublicKeySize)
	enSig := r.field("endorsement signature", ed25519.SignatureSize, ed25519.SignatureSize)
	r.end()
	if r.err != nil {
		return r.err
	}
	q.Chain = make([][]byte, len(chain))
	for i, c := range chain {
		q.Chain[i] = append([]byte(nil), c...)
	}
	q.Statement.BootPublicKey = append(ed25519.PublicKey(nil), bootKey...)
	q.StatementSig = append([]byte(nil), stSig...)
	q.Endorsement.SenderKey = append(ed25519.PublicKey(nil), senderKey...)
	q.EndorsementSig = append([]byte(nil), enSig...)
	*p = q
	return nil
}

// TrustBundle is what a daemon trusts machine proofs against: the CA of its
// fleet (or of its project, or the operator's) and the trust domain of its
// node certificates.
type TrustBundle struct {
	// Roots are the trusted root certificates. Required: a nil pool does
	// not mean the system roots here.
	Roots *x509.CertPool
	// TrustDomain is the SPIFFE trust domain the node certificates must
	// name. Required.
	TrustDomain string
}

// Peer is the sender a machine proof proves: client Sender, with key
// SenderKey, of the daemon of node NodeID in its boot BootID. The caller
// checks that the call gives this node and this sender (see
// [Verifier.VerifyPeer]), and, for a launch, that the launch places
// instance Sender on node NodeID.
type Peer struct {
	NodeID    string
	BootID    string
	Sender    string
	SenderKey ed25519.PublicKey
}

// VerifyMachineProof checks the machine proof of a call from another
// machine, as the daemon of namespace namespace trusting trust, at time now
// (zero means time.Now()). It returns the peer the proof proves, or a
// [*Rejection] with Check [CheckMachineProof] whose message names the first
// check that failed, in this order:
//
//  1. the proof is present and every field within the format's limits;
//  2. each certificate of the chain parses;
//  3. the chain verifies to trust.Roots, for client authentication, at now;
//  4. the leaf is a node certificate ([pki.ParseNodeCert]) of
//     trust.TrustDomain, with an ECDSA P-256 key;
//  5. the boot statement's signature verifies with the leaf's key;
//  6. the statement names the leaf's node id and this namespace;
//  7. the endorsement's signature verifies with the statement's boot key
//     (otherwise it is forged);
//  8. the endorsement names the statement's namespace, node and boot.
//
// A daemon with no CA to trust (nil trust.Roots) or no trust domain refuses
// every machine proof.
func VerifyMachineProof(p *MachineProof, trust TrustBundle, namespace string, now time.Time) (*Peer, error) {
	peer, _, err := verifyMachineProof(p, trust, namespace, now)
	return peer, err
}

// verifyMachineProof is VerifyMachineProof, also returning the verified
// chain, leaf first, root last.
func verifyMachineProof(p *MachineProof, trust TrustBundle, namespace string, now time.Time) (*Peer, []*x509.Certificate, error) {
	if trust.Roots == nil || trust.TrustDomain == "" {
		return nil, nil, reject(CheckMachineProof, "this daemon has no machine CA and trust domain, so it takes no call of another machine")
	}
	if p == nil {
		return nil, nil, reject(CheckMachineProof, "a call of another machine needs a machine proof")
	}
	if err := p.check(); err != nil {
		var fe *formatError
		errors.As(err, &fe)
		if fe.what == "machine proof" {
			return nil, nil, rejectCause(err, CheckMachineProof, "the proof is malformed: %s", fe.detail)
		}
		return nil, nil, rejectCause(err, CheckMachineProof, "the proof's %s is malformed: %s", fe.what, fe.detail)
	}
	if now.IsZero() {
		now = time.Now()
	}

	certs := make([]*x509.Certificate, len(p.Chain))
	for i, der := range p.Chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, rejectCause(err, CheckMachineProof, "certificate %d of the chain does not parse: %v", i, err)
		}
		certs[i] = c
	}
	leaf := certs[0]
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{
		Roots:         trust.Roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return nil, nil, rejectCause(err, CheckMachineProof, "the certificate chain is expired or not yet valid at %s: %v", now.UTC().Format(time.RFC3339), err)
		}
		return nil, nil, rejectCause(err, CheckMachineProof, "the certificate chain does not verify against this daemon's CA: %v", err)
	}
	info, err := pki.ParseNodeCert(leaf)
	if err != nil {
		return nil, nil, rejectCause(err, CheckMachineProof, "the leaf certificate is not a node certificate: %v", err)
	}
	if info.TrustDomain != trust.TrustDomain {
		return nil, nil, reject(CheckMachineProof, "the node certificate is of trust domain %s, not this daemon's %s", quote(info.TrustDomain), quote(trust.TrustDomain))
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, nil, reject(CheckMachineProof, "the node certificate's key is not ECDSA P-256")
	}

	st := &p.Statement
	d := st.digest()
	if !pki.VerifyP1363(pub, d[:], p.StatementSig) {
		return nil, nil, reject(CheckMachineProof, "the boot statement's signature does not verify with the key of node certificate %s", quote(info.NodeID))
	}
	if st.NodeID != info.NodeID {
		return nil, nil, reject(CheckMachineProof, "the boot statement names node %s, but the certificate is node %s", quote(st.NodeID), quote(info.NodeID))
	}
	if st.Namespace != namespace {
		return nil, nil, reject(CheckMachineProof, "the boot statement is for namespace %s, not this daemon's %s", quote(st.Namespace), quote(namespace))
	}

	en := &p.Endorsement
	if !ed25519.Verify(st.BootPublicKey, en.signed(), p.EndorsementSig) {
		return nil, nil, reject(CheckMachineProof, "the endorsement of sender %s does not verify with the boot key of the statement: it is forged", quote(en.Sender))
	}
	switch {
	case en.Namespace != st.Namespace:
		return nil, nil, reject(CheckMachineProof, "the endorsement is for namespace %s, but the boot statement for %s", quote(en.Namespace), quote(st.Namespace))
	case en.NodeID != st.NodeID:
		return nil, nil, reject(CheckMachineProof, "the endorsement names node %s, but the boot statement %s", quote(en.NodeID), quote(st.NodeID))
	case en.BootID != st.BootID:
		return nil, nil, reject(CheckMachineProof, "the endorsement names boot %s, but the boot statement %s", quote(en.BootID), quote(st.BootID))
	}
	return &Peer{
		NodeID:    info.NodeID,
		BootID:    st.BootID,
		Sender:    en.Sender,
		SenderKey: append(ed25519.PublicKey(nil), en.SenderKey...),
	}, chains[0], nil
}
