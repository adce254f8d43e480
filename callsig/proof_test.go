package callsig

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki"
)

const (
	testTD    = "fleet.example.test"
	testNode  = "node-a"
	testBoot  = "boot-0001"
	otherNode = "node-b"
)

// testFleet is a fleet's PKI, made by pki.Init, and the trust bundle its
// daemons check machine proofs against.
type testFleet struct {
	auth  *pki.Authority
	dir   string
	trust TrustBundle
}

func newTestFleet(tb testing.TB, td string) *testFleet {
	tb.Helper()
	dir := tb.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{TrustDomain: td, Now: testNow}); err != nil {
		tb.Fatalf("pki.Init: %v", err)
	}
	a, err := pki.LoadAuthority(dir)
	if err != nil {
		tb.Fatalf("pki.LoadAuthority: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(a.Root)
	return &testFleet{auth: a, dir: dir, trust: TrustBundle{Roots: roots, TrustDomain: td}}
}

// issuerFor returns an issuer under the fleet's node CA that writes trust
// domain td into certificates: a CA that the fleet trusts, misused.
func (f *testFleet) issuerFor(tb testing.TB, td string) *pki.Issuer {
	tb.Helper()
	key, err := pki.ReadPrivateKey(pki.Path(f.dir, pki.NodeCAKeyFile))
	if err != nil {
		tb.Fatal(err)
	}
	iss, err := pki.NewIssuer(f.auth.NodeCA, key, nil, td)
	if err != nil {
		tb.Fatal(err)
	}
	return iss
}

// testMachine is a daemon at one boot: its node certificate and key, its
// boot key, and its signed boot statement.
type testMachine struct {
	nodeKey *ecdsa.PrivateKey
	leaf    *x509.Certificate
	chain   [][]byte
	bootKey ed25519.PrivateKey
	st      BootStatement
	stSig   []byte
}

func newTestMachine(tb testing.TB, iss *pki.Issuer, nodeID, namespace string) *testMachine {
	tb.Helper()
	nodeKey, err := pki.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	leaf, err := iss.Issue(pki.LeafRequest{
		PublicKey: nodeKey.Public(), NodeID: nodeID, Role: "worker",
		NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(23 * time.Hour),
	})
	if err != nil {
		tb.Fatalf("Issue: %v", err)
	}
	m := &testMachine{nodeKey: nodeKey, leaf: leaf, chain: [][]byte{leaf.Raw}, bootKey: testKey("boot " + nodeID)}
	for _, c := range iss.Chain() {
		m.chain = append(m.chain, c.Raw)
	}
	m.st = BootStatement{Namespace: namespace, NodeID: nodeID, BootID: testBoot, BootPublicKey: m.bootKey.Public().(ed25519.PublicKey)}
	m.stSig, err = m.st.Sign(nodeKey)
	if err != nil {
		tb.Fatalf("BootStatement.Sign: %v", err)
	}
	return m
}

// proof endorses sender's key and returns the proof its calls carry.
func (m *testMachine) proof(tb testing.TB, sender string, key ed25519.PublicKey) *MachineProof {
	tb.Helper()
	en := Endorsement{Namespace: m.st.Namespace, NodeID: m.st.NodeID, BootID: m.st.BootID, Sender: sender, SenderKey: key}
	sig, err := en.Sign(m.bootKey)
	if err != nil {
		tb.Fatalf("Endorsement.Sign: %v", err)
	}
	return &MachineProof{Chain: m.chain, Statement: m.st, StatementSig: m.stSig, Endorsement: en, EndorsementSig: sig}
}

func instPub() ed25519.PublicKey { return testKey("inst").Public().(ed25519.PublicKey) }

func TestVerifyMachineProofAccepts(t *testing.T) {
	f := newTestFleet(t, testTD)
	m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
	p := m.proof(t, testInst, instPub())

	// Through the wire, as the receiving daemon gets it.
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatalf("MarshalBinary: %v", err)
	}
	var got MachineProof
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatalf("UnmarshalBinary: %v", err)
	}
	peer, err := VerifyMachineProof(&got, f.trust, testNS, testNow)
	if err != nil {
		t.Fatalf("VerifyMachineProof: %v", err)
	}
	want := Peer{NodeID: testNode, BootID: testBoot, Sender: testInst, SenderKey: instPub()}
	if peer.NodeID != want.NodeID || peer.BootID != want.BootID || peer.Sender != want.Sender || !peer.SenderKey.Equal(want.SenderKey) {
		t.Errorf("peer = %+v, want %+v", peer, want)
	}

	// The call itself verifies under the endorsed key, once.
	c := newClock(testNow)
	v := newTestVerifier(t, KeyMap{}, c.Now, 0)
	call := mustSign(t, newTestSigner(t, testInst, testKey("inst"), c.Now), "x")
	if err := v.VerifyPeer(call, peer); err != nil {
		t.Fatalf("VerifyPeer: %v", err)
	}
	wantRejection(t, v.VerifyPeer(cloneEnvelope(call), peer), CheckReplay, "replayed")

	// A chain without the intermediate does not lead to the root.
	p.Chain = p.Chain[:1]
	_, err = VerifyMachineProof(p, f.trust, testNS, testNow)
	wantRejection(t, err, CheckMachineProof, "does not verify against this daemon's CA")
}

func TestVerifyMachineProofRefuses(t *testing.T) {
	f := newTestFleet(t, testTD)
	other := newTestFleet(t, testTD) // another CA, same trust domain
	tests := []struct {
		name string
		// make returns the proof and lets the case change the receiver's
		// trust, namespace and clock.
		make   func(t *testing.T, trust *TrustBundle, ns *string, now *time.Time) *MachineProof
		substr string
		cause  error // when set, the rejection wraps an error of this type
	}{
		{
			name: "a forged endorsement is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
				p := m.proof(t, testInst, instPub())
				// Signed by a key that is not the boot key.
				p.EndorsementSig, _ = p.Endorsement.Sign(testKey("not the boot key"))
				return p
			},
			substr: `the endorsement of sender "inst-7f3a" does not verify with the boot key of the statement: it is forged`,
		},
		{
			name: "an endorsement whose sender was changed is refused as forged",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				p := newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
				p.Endorsement.Sender = testCLI
				return p
			},
			substr: "it is forged",
		},
		{
			name: "an endorsement whose key was changed is refused as forged",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				p := newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
				p.Endorsement.SenderKey = testKey("attacker").Public().(ed25519.PublicKey)
				return p
			},
			substr: "it is forged",
		},
		{
			name: "a statement for another namespace is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				return newTestMachine(t, f.auth.Issuer, testNode, "other-ns").proof(t, testInst, instPub())
			},
			substr: `the boot statement is for namespace "other-ns", not this daemon's "fleet-ns"`,
		},
		{
			name: "a proof checked by a daemon of another namespace is refused",
			make: func(t *testing.T, _ *TrustBundle, ns *string, _ *time.Time) *MachineProof {
				*ns = "other-ns"
				return newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
			},
			substr: `for namespace "fleet-ns", not this daemon's "other-ns"`,
		},
		{
			name: "a statement whose namespace was changed after signing is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				m := newTestMachine(t, f.auth.Issuer, testNode, "other-ns")
				p := m.proof(t, testInst, instPub())
				p.Statement.Namespace = testNS
				return p
			},
			substr: `the boot statement's signature does not verify with the key of node certificate "node-a"`,
		},
		{
			name: "a statement signed by another node's key is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				a := newTestMachine(t, f.auth.Issuer, testNode, testNS)
				b := newTestMachine(t, f.auth.Issuer, otherNode, testNS)
				p := b.proof(t, testInst, instPub())
				p.Chain = a.chain // node-a's certificate with node-b's statement
				return p
			},
			substr: "the boot statement's signature does not verify",
		},
		{
			name: "a statement naming another node than its certificate is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
				m.st.NodeID = otherNode
				var err error
				if m.stSig, err = m.st.Sign(m.nodeKey); err != nil {
					t.Fatal(err)
				}
				return m.proof(t, testInst, instPub())
			},
			substr: `the boot statement names node "node-b", but the certificate is node "node-a"`,
		},
		{
			name: "an endorsement of another boot is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
				p := m.proof(t, testInst, instPub())
				p.Endorsement.BootID = "boot-0000"
				p.EndorsementSig, _ = p.Endorsement.Sign(m.bootKey)
				return p
			},
			substr: `the endorsement names boot "boot-0000", but the boot statement "boot-0001"`,
		},
		{
			name: "an endorsement for another namespace is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
				p := m.proof(t, testInst, instPub())
				p.Endorsement.Namespace = "other-ns"
				p.EndorsementSig, _ = p.Endorsement.Sign(m.bootKey)
				return p
			},
			substr: `the endorsement is for namespace "other-ns", but the boot statement for "fleet-ns"`,
		},
		{
			name: "an endorsement naming another node is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
				p := m.proof(t, testInst, instPub())
				p.Endorsement.NodeID = otherNode
				p.EndorsementSig, _ = p.Endorsement.Sign(m.bootKey)
				return p
			},
			substr: `the endorsement names node "node-b", but the boot statement "node-a"`,
		},
		{
			name: "a certificate of another trust domain under the same CA is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				return newTestMachine(t, f.issuerFor(t, "elsewhere.test"), testNode, testNS).proof(t, testInst, instPub())
			},
			substr: `the node certificate is of trust domain "elsewhere.test", not this daemon's "fleet.example.test"`,
		},
		{
			name: "a certificate of another CA is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				return newTestMachine(t, other.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
			},
			substr: "the certificate chain does not verify against this daemon's CA",
			cause:  x509.UnknownAuthorityError{},
		},
		{
			name: "an expired chain is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, now *time.Time) *MachineProof {
				*now = testNow.Add(24 * time.Hour)
				return newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
			},
			substr: "the certificate chain is expired or not yet valid at 2026-03-02T12:00:00Z",
			cause:  x509.CertificateInvalidError{},
		},
		{
			name: "a chain that is not yet valid is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, now *time.Time) *MachineProof {
				*now = testNow.Add(-2 * time.Hour)
				return newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
			},
			substr: "expired or not yet valid",
		},
		{
			name: "a leaf that is not a node certificate is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				p := newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
				// The admin credential chains to the same root (through
				// the admin CA) but names spiffe://<td>/admin/owner.
				owner, err := pki.ReadCerts(pki.Path(f.dir, pki.OwnerCertFile))
				if err != nil {
					t.Fatal(err)
				}
				p.Chain = [][]byte{owner[0].Raw, f.auth.AdminCA.Raw}
				return p
			},
			substr: "the leaf certificate is not a node certificate",
		},
		{
			name: "a certificate that does not parse is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				p := newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
				p.Chain = [][]byte{p.Chain[0], []byte("not DER")}
				return p
			},
			substr: "certificate 1 of the chain does not parse",
		},
		{
			name: "a daemon with no machine CA refuses every proof",
			make: func(t *testing.T, trust *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				trust.Roots = nil
				return newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
			},
			substr: "this daemon has no machine CA",
		},
		{
			name: "a call with no proof is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				return nil
			},
			substr: "a call of another machine needs a machine proof",
		},
		{
			name: "a proof with an empty chain is refused",
			make: func(t *testing.T, _ *TrustBundle, _ *string, _ *time.Time) *MachineProof {
				p := newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
				p.Chain = nil
				return p
			},
			substr: "chain is missing",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			trust, ns, now := f.trust, testNS, testNow
			p := tt.make(t, &trust, &ns, &now)
			peer, err := VerifyMachineProof(p, trust, ns, now)
			if peer != nil {
				t.Errorf("got a peer %+v with the error", peer)
			}
			wantRejection(t, err, CheckMachineProof, tt.substr)
			switch want := tt.cause.(type) {
			case x509.UnknownAuthorityError:
				if !errors.As(err, &want) {
					t.Errorf("%v does not wrap an x509.UnknownAuthorityError", err)
				}
			case x509.CertificateInvalidError:
				if !errors.As(err, &want) {
					t.Errorf("%v does not wrap an x509.CertificateInvalidError", err)
				}
			}
		})
	}
}

// The owner credential's chain leads to the fleet's root, so the
// "not a node certificate" case above reaches the node certificate check
// only when the admin CA's chain is trusted too; this test makes sure the
// case tests what it says.
func TestAdminCertificateChainsToTheRoot(t *testing.T) {
	f := newTestFleet(t, testTD)
	owner, err := pki.ReadCerts(pki.Path(f.dir, pki.OwnerCertFile))
	if err != nil {
		t.Fatal(err)
	}
	inter := x509.NewCertPool()
	inter.AddCert(f.auth.AdminCA)
	if _, err := owner[0].Verify(x509.VerifyOptions{Roots: f.trust.Roots, Intermediates: inter, CurrentTime: testNow,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("owner certificate does not chain to the root: %v", err)
	}
}

func TestVerifyPeerRefuses(t *testing.T) {
	f := newTestFleet(t, testTD)
	m := newTestMachine(t, f.auth.Issuer, testNode, testNS)
	peer, err := VerifyMachineProof(m.proof(t, testInst, instPub()), f.trust, testNS, testNow)
	if err != nil {
		t.Fatal(err)
	}
	c := newClock(testNow)
	tests := []struct {
		name   string
		call   func(t *testing.T) (*Envelope, *Peer)
		check  string
		substr string
	}{
		{
			name: "an unsigned call of another machine is refused",
			call: func(t *testing.T) (*Envelope, *Peer) {
				e := mustSign(t, newTestSigner(t, testInst, testKey("inst"), c.Now), "x")
				e.Signature = nil
				return e, peer
			},
			check: CheckNoSignature, substr: "no signature",
		},
		{
			name: "a call of another machine without a proof is refused",
			call: func(t *testing.T) (*Envelope, *Peer) {
				return mustSign(t, newTestSigner(t, testInst, testKey("inst"), c.Now), "x"), nil
			},
			check: CheckMachineProof, substr: "needs a machine proof",
		},
		{
			name: "a call giving another sender than its proof endorses is refused",
			call: func(t *testing.T) (*Envelope, *Peer) {
				return mustSign(t, newTestSigner(t, testCLI, testKey("inst"), c.Now), "x"), peer
			},
			check: CheckMachineProof, substr: `the call gives sender "nodetrust-cli", but its machine proof endorses "inst-7f3a"`,
		},
		{
			name: "a call not signed by the endorsed key is refused",
			call: func(t *testing.T) (*Envelope, *Peer) {
				return mustSign(t, newTestSigner(t, testInst, testKey("attacker"), c.Now), "x"), peer
			},
			check: CheckSignature, substr: `does not verify with the key of sender "inst-7f3a"`,
		},
		{
			name: "a peer whose key is not an Ed25519 key is refused",
			call: func(t *testing.T) (*Envelope, *Peer) {
				bad := *peer
				bad.SenderKey = bad.SenderKey[:5]
				return mustSign(t, newTestSigner(t, testInst, testKey("inst"), c.Now), "x"), &bad
			},
			check: CheckMachineProof, substr: "is 5 bytes, not an Ed25519 public key",
		},
		{
			name: "a call of another machine 31 s in the past is refused",
			call: func(t *testing.T) (*Envelope, *Peer) {
				old := newClock(testNow.Add(-31 * time.Second))
				return mustSign(t, newTestSigner(t, testInst, testKey("inst"), old.Now), "x"), peer
			},
			check: CheckTimestamp, substr: "31s before",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newTestVerifier(t, KeyMap{}, c.Now, 0)
			e, p := tt.call(t)
			wantRejection(t, v.VerifyPeer(e, p), tt.check, tt.substr)
		})
	}
}

func TestSignProofPartsRefuses(t *testing.T) {
	nodeKey, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	boot := testKey("boot").Public().(ed25519.PublicKey)
	st := BootStatement{Namespace: testNS, NodeID: testNode, BootID: testBoot, BootPublicKey: boot}
	t.Run("a statement with an invalid node id is not signed", func(t *testing.T) {
		bad := st
		bad.NodeID = "Node_A"
		if _, err := bad.Sign(nodeKey); err == nil || !strings.Contains(err.Error(), "node id") {
			t.Fatalf("Sign: %v", err)
		}
	})
	t.Run("a statement without a boot key is not signed", func(t *testing.T) {
		bad := st
		bad.BootPublicKey = nil
		_, err := bad.Sign(nodeKey)
		wantMalformed(t, err, "boot public key is 0 bytes, want 32")
	})
	t.Run("a statement is not signed with an Ed25519 node key", func(t *testing.T) {
		if _, err := st.Sign(testKey("x")); err == nil || !strings.Contains(err.Error(), "want ECDSA") {
			t.Fatalf("Sign: %v", err)
		}
	})
	t.Run("a statement signature is 64 bytes of P1363", func(t *testing.T) {
		sig, err := st.Sign(nodeKey)
		if err != nil {
			t.Fatal(err)
		}
		d := st.digest()
		if len(sig) != StatementSigSize || !pki.VerifyP1363(&nodeKey.PublicKey, d[:], sig) {
			t.Fatalf("signature %x does not verify", sig)
		}
	})
	en := Endorsement{Namespace: testNS, NodeID: testNode, BootID: testBoot, Sender: testInst, SenderKey: instPub()}
	t.Run("an endorsement without a sender is not signed", func(t *testing.T) {
		bad := en
		bad.Sender = ""
		_, err := bad.Sign(testKey("boot"))
		wantMalformed(t, err, "sender is missing")
	})
	t.Run("an endorsement needs an Ed25519 private key", func(t *testing.T) {
		if _, err := en.Sign(testKey("boot")[:32]); err == nil || !strings.Contains(err.Error(), "boot key is 32 bytes") {
			t.Fatalf("Sign: %v", err)
		}
	})
}

func TestMachineProofRoundTripAndRefusals(t *testing.T) {
	f := newTestFleet(t, testTD)
	p := newTestMachine(t, f.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got MachineProof
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	again, err := got.MarshalBinary()
	if err != nil || !bytes.Equal(again, b) {
		t.Fatalf("re-marshal: %v, equal %v", err, bytes.Equal(again, b))
	}
	for n := range len(b) {
		var q MachineProof
		if err := q.UnmarshalBinary(b[:n]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("prefix of %d bytes: %v, want ErrMalformed", n, err)
		}
	}
	tests := []struct {
		name   string
		data   []byte
		substr string
	}{
		{"a trailing byte is refused", append(bytes.Clone(b), 1), "1 bytes after the last field"},
		{"an unknown version is refused", append([]byte{9}, b[1:]...), "version byte is 0x09"},
		{"an empty chain is refused", []byte{1, 0, 0, 0, 0}, "chain holds 0 certificates, want 1 to 8"},
		{"a chain of 9 certificates is refused", []byte{1, 0, 0, 0, 9}, "chain holds 9 certificates"},
		{"an oversized certificate is refused", []byte{1, 0, 0, 0, 1, 0, 0, 0x40, 1}, "certificate 0 is 16385 bytes, more than the limit of 16384"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q MachineProof
			wantMalformed(t, q.UnmarshalBinary(tt.data), tt.substr)
		})
	}
	t.Run("a proof with a short statement signature is not marshalled", func(t *testing.T) {
		q := *p
		q.StatementSig = q.StatementSig[:10]
		_, err := q.MarshalBinary()
		wantMalformed(t, err, "statement signature is 10 bytes, want 64")
	})
}
