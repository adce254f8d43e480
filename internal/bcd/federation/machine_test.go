package federation

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/pki"
)

const (
	testTD   = "fleet.test"
	testNS   = "fleet-ns"
	testNode = "node-a"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newIssuer(t *testing.T, td string) (*pki.Issuer, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "root"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(der)
	iss, err := pki.NewIssuer(root, key, nil, td)
	if err != nil {
		t.Fatal(err)
	}
	return iss, root
}

// issue returns an identity for node with a new key, and the key's PEM.
func issue(t *testing.T, iss *pki.Issuer, root *x509.Certificate, node string) (identity.Identity, []byte) {
	t.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := iss.Issue(pki.LeafRequest{PublicKey: key.Public(), NodeID: node, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	pem, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return identity.Identity{NodeID: node, SPIFFEID: pki.NodeSPIFFEID(iss.TrustDomain(), node), TrustDomain: iss.TrustDomain(), Role: "worker",
		Attestor: "token", KeyKind: identity.KeyKindFile, Chain: [][]byte{leaf.Raw}, Roots: [][]byte{root.Raw}}, pem
}

func verify(t *testing.T, m *Machine, sender string) *callsig.MachineProof {
	t.Helper()
	p, err := m.Proof(sender)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := callsig.VerifyMachineProof(p, m.Trust(), testNS, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if peer.NodeID != testNode || peer.Sender != sender || peer.BootID != m.BootID() {
		t.Fatalf("proof proves %+v", peer)
	}
	// The encoding a relay sends, kept between calls, is this proof's.
	want, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got, err := m.ProofBytes(sender)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("ProofBytes is not the encoding of the current proof")
		}
	}
	return p
}

// TestProofFollowsTheRenewedCertificate: after bcd node renews, the next
// proof carries the new chain and a statement signed by the new key, also
// while node.key.next is not yet promoted.
func TestProofFollowsTheRenewedCertificate(t *testing.T) {
	iss, root := newIssuer(t, testTD)
	dir := t.TempDir()
	id, keyPEM := issue(t, iss, root, testNode)
	if err := identity.Persist(dir, id, keyPEM, time.Now()); err != nil {
		t.Fatal(err)
	}
	st, err := identity.LoadState(dir, identity.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Now()}
	m, err := New(Config{Namespace: testNS, State: st, Dir: dir, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	instKey, _, _ := ed25519.GenerateKey(rand.Reader)
	if err := m.Endorse("trainer", instKey); err != nil {
		t.Fatal(err)
	}
	first := verify(t, m, "trainer")

	// A renewal stopped after it stored identity.json: node.key is the old
	// key, node.key.next the new one.
	next, nextPEM := issue(t, iss, root, testNode)
	stop := errors.New("stop")
	func() {
		defer func() {
			if r := recover(); r != nil && r != stop {
				panic(r)
			}
		}()
		_ = identity.StoreRenewal(dir, next, nextPEM, func(step string) {
			if step == identity.StepIdentity {
				panic(stop)
			}
		})
	}()
	clk.Add(2 * time.Second)
	mid := verify(t, m, "trainer")
	if string(mid.Chain[0]) == string(first.Chain[0]) || string(mid.Chain[0]) != string(next.Chain[0]) {
		t.Fatal("the proof does not carry the renewed certificate")
	}

	// The renewal completes; and another.
	if err := identity.StoreRenewal(dir, next, nextPEM, nil); err != nil {
		t.Fatal(err)
	}
	third, thirdPEM := issue(t, iss, root, testNode)
	if err := identity.StoreRenewal(dir, third, thirdPEM, nil); err != nil {
		t.Fatal(err)
	}
	clk.Add(2 * time.Second)
	if got := verify(t, m, "trainer"); string(got.Chain[0]) != string(third.Chain[0]) {
		t.Fatal("the proof does not carry the second renewal")
	}
	if m.Certificate().Equal(st.Leaf) {
		t.Error("Certificate is still the first one")
	}
}

func TestProofNeedsAnEndorsementAndACertificate(t *testing.T) {
	iss, root := newIssuer(t, testTD)
	id, keyPEM := issue(t, iss, root, testNode)
	dir := t.TempDir()
	if err := identity.Persist(dir, id, keyPEM, time.Now()); err != nil {
		t.Fatal(err)
	}
	st, err := identity.LoadState(dir, identity.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Namespace: testNS, State: st})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Proof("nobody"); !errors.Is(err, ErrNotEndorsed) {
		t.Errorf("proof of a sender never endorsed: %v", err)
	}
	k, _, _ := ed25519.GenerateKey(rand.Reader)
	_ = m.Endorse("gone", k)
	if _, err := m.ProofBytes("gone"); err != nil {
		t.Fatal(err)
	}
	m.Forget("gone", k)
	if _, err := m.Proof("gone"); !errors.Is(err, ErrNotEndorsed) {
		t.Errorf("proof of a forgotten sender: %v", err)
	}
	if _, err := m.ProofBytes("gone"); !errors.Is(err, ErrNotEndorsed) {
		t.Errorf("kept proof of a forgotten sender: %v", err)
	}
	// A new key of the same sender gives a new encoding.
	k2, _, _ := ed25519.GenerateKey(rand.Reader)
	_ = m.Endorse("again", k)
	b1, _ := m.ProofBytes("again")
	_ = m.Endorse("again", k2)
	b2, err := m.ProofBytes("again")
	if err != nil {
		t.Fatal(err)
	}
	var p2 callsig.MachineProof
	if err := p2.UnmarshalBinary(b2); err != nil || bytes.Equal(b1, b2) || !p2.Endorsement.SenderKey.Equal(k2) {
		t.Errorf("after a new endorsement the kept proof does not endorse the new key (err %v)", err)
	}

	bare, err := New(Config{Namespace: testNS, NodeID: "node-n"})
	if err != nil {
		t.Fatal(err)
	}
	_ = bare.Endorse("x", k)
	if _, err := bare.Proof("x"); !errors.Is(err, ErrNoCertificate) {
		t.Errorf("proof of a daemon with no certificate: %v", err)
	}
	if tb := bare.Trust(); tb.Roots != nil {
		t.Error("a daemon with no certificate trusts roots")
	}
}

func TestVerifyServerChecksTheNodeCalled(t *testing.T) {
	iss, root := newIssuer(t, testTD)
	id, keyPEM := issue(t, iss, root, testNode)
	dir := t.TempDir()
	if err := identity.Persist(dir, id, keyPEM, time.Now()); err != nil {
		t.Fatal(err)
	}
	st, _ := identity.LoadState(dir, identity.LoadOptions{})
	m, err := New(Config{Namespace: testNS, State: st})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := issue(t, iss, root, "node-b")
	leaf, _ := x509.ParseCertificate(other.Chain[0])
	if err := m.VerifyServer([]*x509.Certificate{leaf}, "node-b"); err != nil {
		t.Errorf("node-b's certificate as node-b: %v", err)
	}
	if err := m.VerifyServer([]*x509.Certificate{leaf}, "node-c"); err == nil || !strings.Contains(err.Error(), `is node "node-b"`) {
		t.Errorf("node-b's certificate as node-c: %v", err)
	}
	foreignIss, foreignRoot := newIssuer(t, "elsewhere.test")
	foreign, _ := issue(t, foreignIss, foreignRoot, "node-b")
	fleaf, _ := x509.ParseCertificate(foreign.Chain[0])
	if err := m.VerifyServer([]*x509.Certificate{fleaf}, "node-b"); err == nil || !strings.Contains(err.Error(), "does not verify against this daemon's CA") {
		t.Errorf("a certificate of another CA: %v", err)
	}
}

// closingKey is a node key that holds a resource, as a TPM key does.
type closingKey struct {
	crypto.Signer
	open *atomic.Int32
}

func (k closingKey) Close() error { k.open.Add(-1); return nil }

// TestAKeyThatHoldsAResourceIsReleased: a TPM-like key of the State is its
// owner's (the agent's): New signs the boot statement with it and neither
// keeps nor closes it; each later use loads the key for that use and
// releases it.
func TestAKeyThatHoldsAResourceIsReleased(t *testing.T) {
	iss, root := newIssuer(t, testTD)
	dir := t.TempDir()
	id, keyPEM := issue(t, iss, root, testNode)
	if err := identity.Persist(dir, id, keyPEM, time.Now()); err != nil {
		t.Fatal(err)
	}
	var open atomic.Int32
	load := func(b []byte) (crypto.Signer, error) {
		k, err := identity.LoadPKCS8Key(b)
		if err != nil {
			return nil, err
		}
		open.Add(1)
		return closingKey{Signer: k, open: &open}, nil
	}
	st, err := identity.LoadState(dir, identity.LoadOptions{KeyLoader: load})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Namespace: testNS, State: st, Dir: dir, LoadKey: load})
	if err != nil {
		t.Fatal(err)
	}
	if n := open.Load(); n != 1 {
		t.Fatalf("%d keys open after New, want 1: the State's, which its owner closes", n)
	}
	k, _, _ := ed25519.GenerateKey(rand.Reader)
	_ = m.Endorse("x", k)
	verify(t, m, "x")
	// A TLS handshake signs with a key loaded for it.
	cert, err := m.ServerTLS().GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	digest := make([]byte, 32)
	if _, err := cert.PrivateKey.(crypto.Signer).Sign(rand.Reader, digest, crypto.SHA256); err != nil {
		t.Fatal(err)
	}
	if n := open.Load(); n != 1 {
		t.Fatalf("%d keys open after a proof and a handshake, want 1: each use released what it loaded", n)
	}
	identity.CloseSigner(st.Key)
	if n := open.Load(); n != 0 {
		t.Fatalf("%d keys open after the owner closed its key", n)
	}
}
