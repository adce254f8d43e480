package agent_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
)

// machineProof builds the machine proof of a call of node st, its boot
// statement signed with the node's key.
func machineProof(t *testing.T, st *identity.State, namespace string) []byte {
	t.Helper()
	bootPub, bootKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	senderPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	node := st.Identity.NodeID
	stmt := callsig.BootStatement{Namespace: namespace, NodeID: node, BootID: "boot-1", BootPublicKey: bootPub}
	stSig, err := stmt.Sign(st.Key)
	if err != nil {
		t.Fatal(err)
	}
	en := callsig.Endorsement{Namespace: namespace, NodeID: node, BootID: "boot-1", Sender: "app", SenderKey: senderPub}
	enSig, err := en.Sign(bootKey)
	if err != nil {
		t.Fatal(err)
	}
	p := &callsig.MachineProof{Chain: st.Identity.Chain, Statement: stmt, StatementSig: stSig, Endorsement: en, EndorsementSig: enSig}
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPeerRevocationReachesTheProofCache: node A's agent subscribes to the
// revocation feed; B's proof, cached by A's (real) proof cache, is refused
// once the control plane revoked B.
func TestPeerRevocationReachesTheProofCache(t *testing.T) {
	for _, transport := range []string{agent.TransportFramed, agent.TransportGRPC} {
		t.Run(transport, func(t *testing.T) { testPeerRevocationReachesTheProofCache(t, transport) })
	}
}

func testPeerRevocationReachesTheProofCache(t *testing.T, transport string) {
	cp := startControlPlane(t)
	dirA, stA := cp.joinNode(t, false)
	_, stB := cp.joinNode(t, false)

	const ns = "fleet.test"
	roots := x509.NewCertPool()
	for _, r := range stA.Roots {
		roots.AddCert(r)
	}
	trust := callsig.TrustBundle{Roots: roots, TrustDomain: stA.Identity.TrustDomain}
	cache := callsig.NewProofCache(0)
	proofB := machineProof(t, stB, ns)
	if _, err := cache.Verify(proofB, trust, ns, time.Time{}); err != nil {
		t.Fatalf("B's proof before the revocation: %v", err)
	}

	w := newWatch()
	c := cp.nodeConfig(dirA, w)
	c.SessionTransport = transport
	heard := make(chan string, 16)
	c.PeerRevoked = func(nodeID, serial string, notAfter time.Time) {
		cache.RevokeCert(nodeID, serial, notAfter, time.Time{})
		heard <- nodeID + "/" + serial
	}
	runNode(t, c)
	w.sessionOpen(t)
	if _, err := cp.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: stB.Identity.NodeID, Reason: "stolen"}); err != nil {
		t.Fatal(err)
	}
	// Pushed, or in the catch-up if the subscription came after the
	// revocation: either way it arrives.
	want := stB.Identity.NodeID + "/" + serialOf(stB)
	for got := ""; got != want; {
		select {
		case got = <-heard:
		case <-time.After(waitLimit):
			t.Fatalf("the agent was not told of B's revocation (%s)", want)
		}
	}
	_, err := cache.Verify(proofB, trust, ns, time.Time{})
	var rej *callsig.Rejection
	if !errors.As(err, &rej) || rej.Check != callsig.CheckMachineProof || !strings.Contains(rej.Msg, "was revoked") {
		t.Fatalf("B's cached proof after its revocation: %v, want refused as revoked", err)
	}
	if _, err := cache.Verify(machineProof(t, stA, ns), trust, ns, time.Time{}); err != nil {
		t.Errorf("A's proof: %v", err)
	}
}
